"""A server the lab starts, as data: its row (:class:`Server`) and how one start runs (:class:`Launch`).

A row of :data:`lablib.engines.servers.SERVERS` names the server's command, its in-process twin and its
stream profile; a command returns a :class:`Launch` (argv, version, readiness paths, model id, environment,
settings). Plain dataclasses: nothing here raises or starts anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lablib.engines.http.protocol import ServerProfile


@dataclass(frozen=True)
class Server:
    """A server the lab starts: a row of :data:`SERVERS`, named by its kind (the http engine's ``server=``).

    ``command``: how to start it, ``(model, host, port, parallel, threads, n_ctx) -> (argv, version,
    readiness paths, the model id requests name, or None for the profile's)``. ``twin``: the
    in-process engine on the same library. ``profile``: how it streams (the http engine's
    :data:`lablib.engines.http.PROFILES` row for its kind). ``aliases``: other names
    :func:`start_server` takes for it.
    """

    command: Callable
    twin: str
    profile: ServerProfile
    aliases: tuple[str, ...] = ()
    startup_timeout_s: float = 180.0  # the default wait for its readiness URL


@dataclass
class Launch:
    """How one server is started: ``argv``, its ``version``, the ``ready`` paths (a 200 from one
    means it serves), the model id requests name (None: the profile's), extra environment
    variables, and ``settings``: what it was started with, by name (recorded in every run's
    manifest). A command may also return the first four as a tuple."""

    argv: list[str]
    version: str
    ready: list[str]
    model_id: str | None = None
    env: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
