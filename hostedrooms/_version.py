"""The package version, read by the package and by telemetry (its instrumentation scope) without a cycle."""

__version__ = "0.1.0"
