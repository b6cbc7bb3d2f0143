"""What the helper will accept, asked before preparing anything for it.

The helper resolves every lower (an image rootfs, a task layer) only below
the ``lower_roots`` of its config file and refuses anything else, but only
when an episode asks for the sandbox. Preparation that builds a lower
elsewhere succeeds for hours and then fails every reset, so the preparing
commands call :func:`check_lower` first. Read with the field names of
helper/config.py, without importing helper/: camg never imports the helper.

Owner names: a service releases every sandbox of its owner name when it
stops (ExecStopPost= release-all, a replaced worker), so two services on one
helper must never share one; :func:`check_owners` refuses that.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping

from camg.errors import ConfigError

log = logging.getLogger(__name__)

#: where packaging/install.sh installs units/helper.json
DEFAULT_HELPER_CONFIG = "/etc/camg/helper.json"
#: helper/config.py's HelperConfig.lower_roots default (used when the file
#: names none)
DEFAULT_LOWER_ROOTS = ("/var/lib/camg/oci-rootfs", "/var/lib/camg/task-layers")


@dataclasses.dataclass(frozen=True)
class HelperRoots:
    config: str
    lower_roots: tuple[str, ...]


def load(path: str | os.PathLike | None = None) -> HelperRoots | None:
    """The helper's lower roots, or None (with a warning) when its config
    cannot be read yet: preparation may run before the helper is installed.
    A config that is there but malformed is an error."""
    path = os.fspath(path or DEFAULT_HELPER_CONFIG)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        log.warning(
            "cannot read the helper config %s (%s): not checking that prepared "
            "lowers are below its lower_roots",
            path,
            exc.strerror,
        )
        return None
    except ValueError as exc:
        raise ConfigError(f"helper config {path} is not JSON: {exc}") from None
    roots = data.get("lower_roots", list(DEFAULT_LOWER_ROOTS)) if isinstance(data, dict) else None
    if not isinstance(roots, list) or not all(
        isinstance(r, str) and os.path.isabs(r) for r in roots
    ):
        raise ConfigError(f"helper config {path}: lower_roots must be a list of absolute paths")
    return HelperRoots(path, tuple(roots))


def is_below(path: str | os.PathLike, roots: tuple[str, ...]) -> bool:
    # realpath on both sides: the helper follows no symlink, so a lower
    # reached through a link into a root is still outside it.
    real = os.path.realpath(path)
    for root in roots:
        top = os.path.realpath(root)
        if real == top or real.startswith(top.rstrip("/") + "/"):
            return True
    return False


def check_lower(
    path: str | os.PathLike, setting: str, roots: HelperRoots | None, what: str | None = None
) -> None:
    """ConfigError naming ``setting`` (what the operator changes) when
    ``path`` (``what``: a directory lowers are built in, by default the
    setting itself) is not below one of the helper's lower roots."""
    if roots is None or is_below(path, roots.lower_roots):
        return
    raise ConfigError(
        f"{what or setting}: {os.fspath(path)!r} is not below a lower root of the helper "
        f"({roots.config}: lower_roots {list(roots.lower_roots)}), which would refuse every "
        f"sandbox built on it; choose a {setting} below one of them, or add a root that "
        f"holds it to lower_roots in {roots.config}"
    )


def check_owners(owners: Mapping[str, str], socket: str) -> None:
    """``owners``: environment -> helper owner name, for services that share
    the helper at ``socket``. ConfigError when two share an owner name."""
    seen: dict[str, str] = {}
    for env, owner in sorted(owners.items()):
        if owner in seen:
            raise ConfigError(
                f"environments.{env}.settings.helper_owner: {owner!r} is also the owner name "
                f"of {seen[owner]!r} on the helper at {socket}; stopping either service would "
                f"release the other's sandboxes. Give each service its own helper_owner "
                f"(the default is the environment's name)"
            )
        seen[owner] = env
