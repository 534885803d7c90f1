"""Request transports and KV-event transports: the contracts (:mod:`.base`, :mod:`.upstreams`)
and the implementations core ships (:mod:`.http`, :mod:`.zmq`).

Importing this package re-exports :mod:`infera_core.transports.base` (the module was
``infera_core/transports.py`` before); that re-export stays for one release.
"""

from infera_core.transports.base import (
    HTTP as HTTP,
)
from infera_core.transports.base import (
    ZMQ as ZMQ,
)
from infera_core.transports.base import (
    Attached as Attached,
)
from infera_core.transports.base import (
    ClientContext as ClientContext,
)
from infera_core.transports.base import (
    KvEventSink as KvEventSink,
)
from infera_core.transports.base import (
    KvEventSource as KvEventSource,
)
from infera_core.transports.base import (
    KvEventTransportFactory as KvEventTransportFactory,
)
from infera_core.transports.base import (
    KvSourceContext as KvSourceContext,
)
from infera_core.transports.base import (
    RequestTransportFactory as RequestTransportFactory,
)
from infera_core.transports.base import (
    WorkerAttachment as WorkerAttachment,
)
from infera_core.transports.base import (
    WorkerContext as WorkerContext,
)
