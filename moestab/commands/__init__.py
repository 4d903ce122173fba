"""Subcommands of the ``moestab`` CLI; each module only parses arguments and calls the library."""
