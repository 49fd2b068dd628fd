"""accel-bpftrace: live, software view of the tacc driver (bcc on the tacc tracepoints)."""
