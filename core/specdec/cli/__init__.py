"""The ``specdec`` command line."""
