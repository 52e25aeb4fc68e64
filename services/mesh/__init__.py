"""Starts, watches and stops the mesh's processes: redis-server, the services and Envoy.

Used by ``fraudmesh up`` and by the integration tests, so both run the mesh the same way:
``process`` launches one child and probes it, ``config`` derives every service's environment
from one ``MeshConfig``, ``topology`` (``Mesh``) starts the children in dependency order and
stops them in reverse, and ``supervisor`` (``Supervisor``, one per ``fraudmesh up``) restarts a
child that dies. Explicit restarts (``Mesh.restart``, the fault matrix) and deliberate stops
are never fought over.
"""

from services.mesh.config import MeshConfig
from services.mesh.process import (
    STARTUP_NICENESS,
    Process,
    free_port,
    grpc_serving,
    http_ok,
    renice_threads,
    tcp_open,
)
from services.mesh.supervisor import CrashHistory, CrashLoop, RestartPolicy, Supervisor
from services.mesh.topology import Mesh

__all__ = [
    "STARTUP_NICENESS",
    "CrashHistory",
    "CrashLoop",
    "Mesh",
    "MeshConfig",
    "Process",
    "RestartPolicy",
    "Supervisor",
    "free_port",
    "grpc_serving",
    "http_ok",
    "renice_threads",
    "tcp_open",
]
