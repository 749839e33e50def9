"""The operator's read model and actions, shared by the command line
(:mod:`crawlproject.cli`) and the dashboard (:mod:`crawlproject.dashboard`);
it imports neither."""
