#!/bin/sh
# Kernel uevent helper of the test VM (no udevd): give accel nodes to group tacc.
case "$ACTION:$DEVNAME" in
add:accel/*) [ -e "/dev/$DEVNAME" ] && chgrp tacc "/dev/$DEVNAME" && chmod 0660 "/dev/$DEVNAME" ;;
esac
exit 0
