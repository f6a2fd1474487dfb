"""The command line: a typer app, one module per command group (house style: ``cli/``)."""
