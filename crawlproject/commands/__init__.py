"""Project commands (``COMMANDS_MODULE``): ``crawl`` with a meaningful exit code,
``settings`` with the add-ons applied."""
