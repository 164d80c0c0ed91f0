"""Which targets exist: discovery of ``cuvil.backends`` entry points.

Every target, the built-in ``reference`` one included, is a distribution's entry
point in the group ``cuvil.backends``: the entry's name is the target string, its
value names a :class:`~cuvil_runtime.target.BackendSpec`. Discovery is lazy in
two steps. The first question reads entry-point *metadata* only (no plugin is
imported), which is enough to detect two distributions claiming one name. A
plugin module is imported, and its ``check`` run, only when that target is asked
about; its ``factory`` runs only when the target itself is requested.

A plugin that fails to import, resolves to something other than a
``BackendSpec``, or whose ``check`` says no, is listed as unavailable with the
reason; it raises only when someone requests it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from cuvil_runtime.target import GRAPH_STAGE, BackendSpec, Capabilities, Loader, Stage, Target

GROUP = "cuvil.backends"
#: seconds a failed availability check is remembered before it is run again
RECHECK_S = 1.0


class UnknownTargetError(LookupError):
    """No installed distribution registers the requested target name."""


class DuplicateTargetError(RuntimeError):
    """Two distributions register the same target name."""


class TargetUnavailableError(RuntimeError):
    """A registered target cannot be used here (missing dependency, broken plugin...)."""

    def __init__(self, name: str, reason: str, install: str | None, *, installed: bool = False) -> None:
        self.name = name
        self.reason = reason
        self.install = install
        # An installed target that fails its check or its factory (no C compiler, no
        # device) is not fixed by installing it again: the reason says what to do.
        hint = f"; to get it: {install}" if install and not installed else ""
        super().__init__(f"target {name!r} is unavailable: {reason}{hint}")


class TargetConfigError(RuntimeError):
    """What a :class:`~cuvil_runtime.target.BackendSpec` ``check`` raises (instead of
    returning a reason) when the user configured its target explicitly in a way that
    cannot work here: an environment variable with a typo, or one naming hardware this
    host lacks (``CUVIL_CPU_ISA=avx512`` on an AVX2 CPU). Unlike a missing dependency,
    that is no reason to compile for another target: the target is unavailable with
    this message, and :func:`default_target` raises :class:`TargetMisconfiguredError`
    rather than pick a lower-priority target in its place."""


class TargetMisconfiguredError(TargetUnavailableError):
    """A target is unavailable because of an explicit setting of the user's (its check
    raised :class:`TargetConfigError`); never answered by falling back to another target."""


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What ``cuvil backends`` shows about one target."""

    name: str
    available: bool
    #: why not, when unavailable
    reason: str | None
    #: the distribution whose entry point registers the target
    distribution: str
    #: the command that makes it available (``None``: built in, nothing to install)
    install: str | None
    priority: int
    description: str
    #: the target's pipeline, in order (stage names)
    stages: tuple[str, ...] = ()
    capabilities: Capabilities | None = None


@dataclass(slots=True)
class _Entry:
    entry_point: EntryPoint
    distribution: str
    #: filled on first use: the spec, or why it could not be loaded / is unusable
    loaded: bool = False
    spec: BackendSpec | None = None
    reason: str | None = None
    error: BaseException | None = None
    #: the check raised :class:`TargetConfigError` (an explicit setting of the user's is wrong)
    misconfigured: bool = False
    #: when the check last failed (``time.monotonic``): a failed check is asked again after
    #: :data:`RECHECK_S`, so a transient failure (a cache folder deleted meanwhile, a compiler
    #: being installed) does not make the target unavailable for the rest of the process
    failed_at: float | None = None


def _distribution_name(ep: EntryPoint) -> str:
    dist = ep.dist
    return dist.name if dist is not None else "<unknown distribution>"


class Registry:
    """Targets registered by entry points; one process-wide instance is :data:`REGISTRY`.

    ``entry_points`` overrides the scan of installed distributions (tests, embedding).
    """

    def __init__(self, entry_points: Iterable[EntryPoint] | None = None) -> None:
        self._explicit = list(entry_points) if entry_points is not None else None
        self._entries: dict[str, _Entry] | None = None
        self._targets: dict[str, Target] = {}
        self._loaders: dict[str, Loader] = {}
        # Plugin imports and factories may be slow; the lock makes concurrent first
        # requests build one target, not two.
        self._lock = threading.RLock()

    def reset(self) -> None:
        """Forget everything: the next question re-scans the installed distributions."""
        with self._lock:
            self._entries = None
            self._targets.clear()
            self._loaders.clear()

    # -- metadata scan (no imports) ----------------------------------------
    def _scan(self) -> dict[str, _Entry]:
        with self._lock:
            if self._entries is None:
                eps = self._explicit if self._explicit is not None else entry_points(group=GROUP)
                entries: dict[str, _Entry] = {}
                for ep in eps:
                    dist = _distribution_name(ep)
                    if ep.name in entries:
                        other = entries[ep.name].distribution
                        raise DuplicateTargetError(
                            f"target {ep.name!r} is registered twice in entry-point group {GROUP!r}: "
                            f"by distribution {other!r} ({entries[ep.name].entry_point.value}) and by "
                            f"distribution {dist!r} ({ep.value}); uninstall one of them"
                        )
                    entries[ep.name] = _Entry(ep, dist)
                self._entries = entries
            return self._entries

    def names(self) -> list[str]:
        return sorted(self._scan())

    # -- loading one plugin ------------------------------------------------
    def _load(self, entry: _Entry) -> _Entry:
        with self._lock:
            if entry.loaded:
                if entry.failed_at is not None and time.monotonic() - entry.failed_at >= RECHECK_S:
                    self._check(entry)  # a failed check is not an answer for good
                return entry
            ep = entry.entry_point
            try:
                obj = ep.load()
            except Exception as e:
                entry.reason = f"cannot import {ep.value}: {type(e).__name__}: {e}"
                entry.error = e
            else:
                if not isinstance(obj, BackendSpec):
                    entry.reason = (
                        f"{ep.value} is a {type(obj).__name__}, not a cuvil_runtime.target.BackendSpec"
                    )
                elif obj.name != ep.name:
                    entry.reason = f"entry point {ep.name!r} resolves to the spec of target {obj.name!r}"
                else:
                    entry.spec = obj
                    self._check(entry)
            entry.loaded = True
            return entry

    @staticmethod
    def _check(entry: _Entry) -> None:
        """Run the spec's availability check into ``entry`` (its spec is loaded)."""
        assert entry.spec is not None
        entry.error, entry.misconfigured = None, False
        try:
            entry.reason = entry.spec.check()
        except TargetConfigError as e:
            entry.reason, entry.error, entry.misconfigured = str(e), e, True
        except Exception as e:
            entry.reason = f"availability check failed: {type(e).__name__}: {e}"
            entry.error = e
        entry.failed_at = None if entry.reason is None else time.monotonic()

    def _info(self, name: str, entry: _Entry) -> BackendInfo:
        entry = self._load(entry)
        spec = entry.spec
        return BackendInfo(
            name=name,
            available=entry.reason is None,
            reason=entry.reason,
            distribution=entry.distribution,
            install=spec.install if spec is not None else None,
            priority=spec.priority if spec is not None else 0,
            description=spec.description if spec is not None else "",
            stages=tuple(st.name for st in spec.stages) if spec is not None else (),
            capabilities=spec.capabilities if spec is not None else None,
        )

    # -- public questions --------------------------------------------------
    def discover(self) -> list[BackendInfo]:
        """Every registered target, available or not, sorted by name (imports every plugin)."""
        entries = self._scan()
        return [self._info(name, entries[name]) for name in sorted(entries)]

    def info(self, name: str) -> BackendInfo:
        """What is known about one target (imports only its plugin)."""
        return self._info(name, self._entry(name))

    def spec(self, name: str) -> BackendSpec:
        """The spec of an available target."""
        entry = self._load(self._entry(name))
        if entry.reason is not None or entry.spec is None:
            install = entry.spec.install if entry.spec is not None else None
            error = TargetMisconfiguredError if entry.misconfigured else TargetUnavailableError
            raise error(
                name, entry.reason or "no spec", install, installed=entry.spec is not None
            ) from entry.error
        return entry.spec

    def get_target(self, name: str) -> Target:
        """The target instance for ``name``, built once and then reused."""
        with self._lock:
            target = self._targets.get(name)
            if target is None:
                spec = self.spec(name)
                try:
                    target = spec.factory()
                except Exception as e:
                    raise TargetUnavailableError(
                        name, f"its factory failed: {type(e).__name__}: {e}", spec.install, installed=True
                    ) from e
                problem = contract_problem(target)
                if problem is not None:
                    raise TargetUnavailableError(
                        name, f"{type(target).__name__} {problem}", spec.install, installed=True
                    )
                self._targets[name] = target
            return target

    def loader(self, name: str) -> Loader:
        """The loader of target ``name``'s ahead-of-time artifacts, built once.

        Without the availability check: a host serving an artifact may lack what
        the target needs to compile (a C compiler), and the loader needs none of it.
        Raises :class:`TargetUnavailableError` when the plugin cannot be imported or
        writes no artifacts.
        """
        entry = self._entry(name)
        with self._lock:
            known = self._loaders.get(name)
            if known is not None:
                return known
            spec = entry.spec
            if spec is None:
                try:
                    obj = entry.entry_point.load()
                except Exception as e:
                    raise TargetUnavailableError(
                        name, f"cannot import {entry.entry_point.value}: {type(e).__name__}: {e}", None
                    ) from e
                spec = obj if isinstance(obj, BackendSpec) and obj.name == name else None
            if spec is None or spec.loader is None:
                raise TargetUnavailableError(
                    name, "it does not load ahead-of-time artifacts", spec.install if spec else None
                )
            try:
                loader = spec.loader()
            except Exception as e:
                raise TargetUnavailableError(
                    name, f"its artifact loader failed: {type(e).__name__}: {e}", spec.install, installed=True
                ) from e
            self._loaders[name] = loader
            return loader

    def default_target(self, device_type: str) -> str:
        """The available target with the highest priority that runs on ``device_type``.

        Ties go to the name that sorts first, so the choice never depends on
        installation order. A target for ``device_type`` that is unavailable because
        of an explicit setting (its check raised :class:`TargetConfigError`) raises
        :class:`TargetMisconfiguredError`: the user asked for something that cannot
        work, and compiling for another target would hide it.
        """
        candidates: list[tuple[int, str]] = []
        unusable: list[str] = []
        for info in self.discover():
            entry = self._entry(info.name)
            devices = entry.spec.capabilities.devices if entry.spec is not None else frozenset()
            if info.available and device_type in devices:
                candidates.append((-info.priority, info.name))
            elif not info.available and (entry.spec is None or device_type in devices):
                if entry.misconfigured and entry.spec is not None:
                    raise TargetMisconfiguredError(
                        info.name,
                        f"{info.reason} (not compiling for another target instead: the setting is explicit)",
                        entry.spec.install,
                        installed=True,
                    ) from entry.error
                unusable.append(f"{info.name} ({info.reason})")
        if not candidates:
            why = f"; unavailable: {', '.join(unusable)}" if unusable else ""
            raise UnknownTargetError(f"no available target runs on device type {device_type!r}{why}")
        return min(candidates)[1]

    def _entry(self, name: str) -> _Entry:
        entries = self._scan()
        try:
            return entries[name]
        except KeyError:
            known = ", ".join(sorted(entries)) or "none"
            raise UnknownTargetError(
                f"unknown target {name!r}; known targets: {known} "
                f"(registered through entry-point group {GROUP!r}; `cuvil backends` shows their status)"
            ) from None


#: the process-wide registry of installed targets
REGISTRY = Registry()


def contract_problem(target: Any) -> str | None:
    """What ``target`` lacks of the :class:`~cuvil_runtime.target.Target` contract, if anything."""
    for attr in ("name", "capabilities", "stages", "hash", "compile"):
        if not hasattr(target, attr):
            return f"does not implement the target contract: it has no {attr!r}"
    stages = target.stages
    if not isinstance(stages, tuple) or not stages or not all(isinstance(s, Stage) for s in stages):
        return "declares no stages: 'stages' must be a non-empty tuple of cuvil_runtime.target.Stage"
    if stages[0] != GRAPH_STAGE:
        return f"must declare the graph_ir stage first, not {stages[0].name!r}"
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        return f"declares a stage twice: {names}"
    if not isinstance(target.capabilities, Capabilities):
        return "has capabilities that are not a cuvil_runtime.target.Capabilities"
    return None


def discover() -> list[BackendInfo]:
    """Every installed target, available or not, sorted by name."""
    return REGISTRY.discover()


def get_target(name: str) -> Target:
    """The target called ``name`` (cached); raises if unknown or unavailable."""
    return REGISTRY.get_target(name)


def default_target(device_type: str) -> str:
    """Name of the best available target for a torch device type ("cpu", "cuda", "npu")."""
    return REGISTRY.default_target(device_type)


def reset() -> None:
    """Re-scan installed distributions on the next question (after installing a plugin)."""
    REGISTRY.reset()


__all__ = [
    "GROUP",
    "REGISTRY",
    "BackendInfo",
    "DuplicateTargetError",
    "RECHECK_S",
    "Registry",
    "TargetConfigError",
    "TargetMisconfiguredError",
    "TargetUnavailableError",
    "UnknownTargetError",
    "contract_problem",
    "default_target",
    "discover",
    "get_target",
    "reset",
]
