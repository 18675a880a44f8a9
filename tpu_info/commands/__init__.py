"""Commands: `tpu-info` and its subcommands, gathering, exit codes."""
