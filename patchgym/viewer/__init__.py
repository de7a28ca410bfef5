"""The trajectory viewer: `make_server(RUN)` serves a local page to browse, filter and read a run's trajectories."""

from patchgym.viewer.server import make_server

__all__ = ["make_server"]
