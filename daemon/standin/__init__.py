"""The stdio relay an agent spawns in place of an MCP server: ``python
-m salvor.daemon.standin URL``.

Rule: standard library only and nothing from salvor, so it starts quickly wherever an MCP client
spawns it. Its code is ``__main__.py``; this file stays empty so ``-m`` imports nothing more.
"""
