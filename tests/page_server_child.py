"""A page server in a process of its own, with few descriptors, as a gateway under load has
(``python page_server_child.py SOURCE NOFILE``): serves SOURCE's pages with PageServer's defaults under a soft
descriptor limit of NOFILE, prints ``{"url": URL}`` and serves until its stdin closes."""

from __future__ import annotations

import json
import resource
import sys


def main(source: str, nofile: str) -> None:
    from hostedrooms.standby import EnginePageSource, PageServer

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), hard))
    with PageServer(EnginePageSource(source)) as server:
        sys.stdout.write(json.dumps({"url": server.url}) + "\n")
        sys.stdout.flush()
        sys.stdin.read()


if __name__ == "__main__":
    main(*sys.argv[1:])
