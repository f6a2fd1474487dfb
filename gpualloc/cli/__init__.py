"""The command line: one argparse parser built from the declarations of the command modules (house
style: ``cli/``)."""
