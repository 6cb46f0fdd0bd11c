"""The salvor daemon: everything that does I/O on top of the pure
``salvor.protocol`` and ``salvor.store``.

Each sub-package is one room with one job. They are layered one way, bottom first; a package
imports only the packages listed before it, and only through their ``__init__`` (which re-exports
the public names explicitly). ``tests/daemon/test_layering.py`` checks both.

    metrics      what operators watch: the Prometheus registry every room counts into, log lines
    web          HTTP plumbing: the listener, body reader, error envelope, request values, TLS
    processes    child processes and this one: spawn, tether, env allow-list, orphans, ports, faults
    models       model wire formats and the gateway that calls a provider; the demo model
    skills       skills: folders of instructions agents read, where they are found, their advert
    tools        the tool registry and the demo tools
    files        the file and shell tools of built-in agents, confined to the operator's workspace
    mcp          the MCP client: server definitions, sessions over stdio and HTTP, MCP tools
    recording    a run's write-ahead record: store access and the run context
    cluster      many nodes over one store: node identity, lease, run ownership, takeover
    flows        the flow tools agents call (ask_user, subagent, finish, flow_results, authoring)
    proxies      the loopback model proxy and MCP stand-in endpoints a process agent talks to
    agents       agent kinds: definitions, credentials, the built-in loop, process and
                 service agents
    graphs       graph runs: the walker that drives a graph's nodes through the run context
    client_runs  client-driven runs: appends, steps, client-performed calls, leases
    runs         the Runtime (the drive, and its services) and the drivers: heal, live events
    notify       notifications: delivering the store's outbox to the operator's webhook or command
    dashboard    the web page's files (HTML, ES modules, CSS) and how to read one
    api          the HTTP control plane: routes, event stream, OpenAPI document
    serve        the ``salvor serve`` lifetime
    cli          the command line

``standin`` stands apart: the stdio relay an agent spawns for an MCP server, standard library only.
"""

LAYERS = (
    "metrics",
    "web",
    "processes",
    "models",
    "skills",
    "tools",
    "files",
    "mcp",
    "recording",
    "cluster",
    "flows",
    "proxies",
    "agents",
    "graphs",
    "client_runs",
    "runs",
    "notify",
    "dashboard",
    "api",
    "serve",
    "cli",
)
