"""The project's one command line (``specheads``): a subcommand for every stage's command."""
