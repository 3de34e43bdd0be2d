"""What a server the lab started was started with, kept on disk while it runs: one JSON card per
loopback port under ``$LABLIB_HOME/servers/running/``, so that a run in another process (``lablib
serve`` in one terminal, ``lablib bench`` in another, a notebook) records the server's settings in
its manifest. A card whose process is gone, or whose port another process now holds, is ignored, and
removed when the next server starts (:func:`prune_cards`).

Card: {"name", "pid", "port", "version", "argv", "log", "settings"} (settings: the server's
:class:`lablib.engines.servers.Launch` settings).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

from lablib.children import pid_alive
from lablib.staging import staged

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cards_dir() -> Path:
    from lablib.config import lab_home

    return lab_home() / "servers" / "running"


def write_card(name: str, pid: int, port: int, version: str, argv, log, settings: dict) -> Path:
    """Write the card of a started server (atomically: a temporary file, then rename); its path."""
    folder = cards_dir()
    folder.mkdir(parents=True, exist_ok=True)
    prune_cards()
    path = folder / f"{int(port)}.json"
    card = {"name": name, "pid": int(pid), "port": int(port), "version": version, "argv": list(argv)}
    card.update(log=str(log), settings=settings)
    with staged(path) as tmp:
        tmp.write_text(json.dumps(card, default=str))
    return path


def remove_card(port: int, pid: int) -> None:
    """Remove the card of ``port`` if it is this server's (``pid``)."""
    path = cards_dir() / f"{int(port)}.json"
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def prune_cards() -> list[Path]:
    """Remove the cards of servers whose process is gone (a lab process killed before it could stop its
    server leaves one); the paths removed. A card being written (``*.<pid>.tmp``) or unreadable is left alone."""
    gone = []
    for path in cards_dir().glob("*.json"):
        try:
            pid = json.loads(path.read_text()).get("pid")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(pid, int) and not pid_alive(pid):
            try:
                path.unlink()
                gone.append(path)
            except OSError:
                pass
    return gone


def card_for(base_url: str) -> dict | None:
    """The card of the lab-started server at ``base_url`` (a loopback URL whose port has a card and
    whose process still runs), or None."""
    u = urlparse(base_url)
    if u.hostname not in LOOPBACK or u.port is None:
        return None
    try:
        card = json.loads((cards_dir() / f"{u.port}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(card, dict) or not isinstance(card.get("pid"), int) or not pid_alive(card["pid"]):
        return None
    return card
