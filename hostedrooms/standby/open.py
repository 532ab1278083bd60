"""The page source a command line names (:func:`open_source`).

It lives apart from :mod:`~hostedrooms.standby.source` and :mod:`~hostedrooms.standby.http` because it chooses
between them: ``http`` builds on ``source``, and this module imports both, so neither imports the other back.
"""

from __future__ import annotations

from typing import Any

from ..limits import Limits
from .http import HttpPageSource
from .source import EnginePageSource, PageSource

__all__ = ["is_http_source", "open_source"]


def is_http_source(spec: str) -> bool:
    """Whether ``spec`` names a gateway's page endpoint (``http://`` or ``https://``) rather than a database."""
    return spec.startswith(("http://", "https://"))


def open_source(spec: str, *, limits: Limits | None = None, **http_options: Any) -> PageSource:
    """The source a command line names: an ``http://`` or ``https://`` URL is a gateway's page endpoint
    (:class:`~hostedrooms.standby.http.HttpPageSource`), anything else the authority's database (a path or a
    database URL, :class:`~hostedrooms.standby.source.EnginePageSource`).

    :param spec: an ``http(s)://`` URL, a path or a database URL.
    :param limits: the limits an engine source checks pages with (default: :mod:`hostedrooms.limits`).
    :param http_options: passed to :class:`~hostedrooms.standby.http.HttpPageSource` (``token=``, ``tls=``, ...).
    :returns: the page source.
    """
    if is_http_source(spec):
        return HttpPageSource(spec, **http_options)
    return EnginePageSource(spec, limits=limits)
