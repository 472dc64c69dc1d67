"""Unit tier: one layer at a time, in-process, no gateway and no mount. Codecs, formats,
kvstore drivers (the S3 driver against the session's moto server) and their contract suites,
detect, classify, validate, errors, store specs, and CLI pieces that mount nothing."""
