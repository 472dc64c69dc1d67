"""Command-line entry points. FUSE is imported late so ``--help`` works without libfuse."""
