"""Project commands (``COMMANDS_MODULE``): ``crawl`` with a meaningful exit code."""
