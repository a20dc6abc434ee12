"""What a person is shown: the wording and the `--json` shapes that the CLI and the
dashboard share, each value made safe to show (forklift._display)."""
