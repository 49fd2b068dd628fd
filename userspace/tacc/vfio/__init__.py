"""VFIO for tacc functions: binding (:mod:`tacc.vfio.bind`) and a user-space driver
over the VFIO uAPI (:mod:`tacc.vfio.driver`).  docs/vfio.md."""
