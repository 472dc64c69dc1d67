"""Gateway tier: :class:`n5fs.gateway.Gateway`, the views over it and the FUSE operations on
top of it, all driven in-process without a mount (no ``/dev/fuse`` needed). Races are made
deterministic by store hooks (:class:`n5fs.testing.doubles.CountingStore`)."""
