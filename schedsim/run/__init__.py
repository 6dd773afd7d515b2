"""``schedsim run`` as functions: load inputs, simulate, summarise and write the outputs."""
