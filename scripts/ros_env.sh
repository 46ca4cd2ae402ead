# Sourced by the scripts: keep DDS on loopback and on a domain of our own.
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 90) + 10 ))}"
