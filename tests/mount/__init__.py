"""Mount tier: every file here mounts real FUSE in some of its tests (marked ``fuse``), each
mount in a child process (``tests/mounting.py``). A file whose other tests run in-process
stays whole here, so the unit and gateway tiers never need ``/dev/fuse``."""
