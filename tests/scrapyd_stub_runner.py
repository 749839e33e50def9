"""A stand-in for scrapyd's job runner (``python -m scrapyd.runner``, scrapyd.conf's
``runner``) for tests/test_scrapyd_launcher.py, which stops scrapyd with jobs running.

``list`` prints the spiders. ``crawl SPIDER -s LOG_FILE=...`` writes to LOG_FILE
what happens to it: ``started pid P session S``, one ``signal N`` line per
signal received; spider ``polite`` closes 0.5 s after its first signal
(``closed``), spider ``stubborn`` ignores signals. Either ends by itself after
60 s, so that no test leaves a process behind for long."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

SPIDERS = ("polite", "stubborn")
LIFETIME = 60.0


def crawl(spider: str, log_file: str) -> None:
    signalled = threading.Event()
    with open(log_file, "a", buffering=1) as log:
        def received(signum, _frame):
            log.write(f"signal {signum}\n")
            signalled.set()

        signal.signal(signal.SIGTERM, received)
        signal.signal(signal.SIGINT, received)
        log.write(f"started pid {os.getpid()} session {os.getsid(0)}\n")
        deadline = time.monotonic() + LIFETIME
        if spider == "polite" and signalled.wait(LIFETIME):
            time.sleep(0.5)  # closing
            log.write("closed\n")
            return
        while time.monotonic() < deadline:  # stubborn: signals change nothing
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    if argv[0] == "list":
        print("\n".join(SPIDERS))
        return 0
    settings = dict(value.split("=", 1) for flag, value in zip(argv[2::2], argv[3::2])
                    if flag == "-s")
    crawl(argv[1], settings["LOG_FILE"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
