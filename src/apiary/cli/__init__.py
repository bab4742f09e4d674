"""The `apiary` command line: thin, parses arguments and calls server/sdk/demo."""
