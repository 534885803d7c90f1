"""The plugin machinery: hook specs (:mod:`.spec`), the entry-point loader (:mod:`.loader`),
the typed facade (:mod:`.hooks`) and backend settings (:mod:`.settings`).

A plugin module needs one name from here, the marker of its hook implementations::

    from infera_core.plugin import hookimpl

Importing this package costs what ``pluggy`` costs: the loader and the facade (which
import every contract) load only when asked for.
"""

from infera_core.plugin.spec import hookimpl

__all__ = ["hookimpl"]
