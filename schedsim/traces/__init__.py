"""Request traces: the columnar table, synthetic generators, readers and importers."""
