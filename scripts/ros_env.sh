# Sourced by the scripts: keep DDS on loopback and on a domain of our own.
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 90) + 10 ))}"
# Shared-memory + loopback-UDP transports (camera images); a lab's own profile wins.
export FASTDDS_DEFAULT_PROFILES_FILE="${FASTDDS_DEFAULT_PROFILES_FILE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/config/fastdds_profile.xml}"
