"""The ``schedsim`` command, one module per command group."""
