"""fast_env: cheap environments and evaluation with rewards identical to tau2's native path.

The reward checks replay a trajectory on a fast episode and evaluate it twice: fast (`evaluate()`) and with tau2's
native evaluation (`evaluate(native=True)`: fresh environments parsed from disk, the whole trajectory replayed).
tau2's native replay raises when any tool result differs from the recorded one, so a passing check also shows the
fast environment answered every call exactly as a native one would.
"""

from __future__ import annotations

import json
import random

import pytest
from task_sample import test_tasks
from tau2.data_model.message import ToolCall
from tau2.data_model.simulation import TerminationReason
from tau2.data_model.tasks import Action
from tau2.environment.toolkit import ToolType
from tau2.registry import registry
from tau2.utils import get_dict_hash

from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.fast_env import CopyOnReadTable, check_shared_records, fast_environment
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions
from tau2_rl_pipeline.benchmark.prompting import tool_schemas
from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, load_tasks

TEST_TASKS = test_tasks()  # every test task (a representative subset in the tau2 1.0.1 pass: tests/task_sample.py)
TEST_TASKS += [("mock", t) for t in load_tasks("mock", "base")]  # mock: initialization data and history


def _ids(params):
    return [f"{d}-{t.id[:40]}" for d, t in params]


def _replay(domain, task, actions) -> Episode:
    episode = Episode(domain, task, None, fast=True)
    episode.start()
    for action in actions:
        call = episode.user_tool_call if action.requestor == "user" else episode.agent_tool_call
        call(action.name, action.arguments)
    episode.agent_says(final_message(task))
    episode.stop(TerminationReason.AGENT_STOP)
    return episode


def _outcome(evaluate) -> tuple:
    """A RewardInfo dump, or the error tau2's evaluation raised (a replayed call answering differently)."""
    try:
        return ("reward", evaluate().model_dump())
    except Exception as e:  # noqa: BLE001 - compared, not swallowed: both paths must fail alike
        return ("error", type(e).__name__, str(e))


def _assert_same_rewards(domain, task, actions, label) -> tuple[Episode, tuple]:
    episode = _replay(domain, task, actions)
    fast, native = _outcome(episode.evaluate), _outcome(lambda: episode.evaluate(native=True))
    assert fast == native, f"{label}: fast {fast!r:.1500}\nnative {native!r:.1500}"
    return episode, fast


# -- perturbed gold actions -------------------------------------------------------------------------------------
_TOOLS = {}


def _is_write(domain, action: Action) -> bool:
    if domain not in _TOOLS:
        _TOOLS[domain] = fast_environment(domain)
    env = _TOOLS[domain]
    toolkit = env.user_tools if action.requestor == "user" else env.tools
    return toolkit.has_tool(action.name) and toolkit.tool_type(action.name) == ToolType.WRITE


_POOLS = {}


def _values_seen(domain, name, arg) -> list:
    """Values the domain's gold actions give this tool argument, across all tasks (plausible, often valid)."""
    if domain not in _POOLS:
        pool = {}
        for task in load_tasks(domain, "base"):
            for a in gold_actions(task):
                for k, v in a.arguments.items():
                    pool.setdefault((a.name, k), set()).add(json.dumps(v, sort_keys=True))
        _POOLS[domain] = {key: sorted(values) for key, values in pool.items()}
    return [json.loads(v) for v in _POOLS[domain].get((name, arg), [])]


def _altered(value, others: list, rng: random.Random):
    others = [v for v in others if v != value]
    if others:
        return rng.choice(others)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return value[:-1]
    return f"{value}X" if isinstance(value, str) else {}


def perturbations(domain, task) -> dict[str, list[Action]]:
    """Deterministic variants of the gold actions: one dropped, one write argument altered, a write swapped with
    its neighbour (each where the task has what it needs)."""
    rng = random.Random(f"{domain}/{task.id}")
    gold = gold_actions(task)
    out = {}
    if gold:
        i = rng.randrange(len(gold))
        out[f"drop #{i} {gold[i].name}"] = gold[:i] + gold[i + 1:]
    writes = [i for i, a in enumerate(gold) if _is_write(domain, a) and a.arguments]
    if writes:
        i = rng.choice(writes)
        arg = rng.choice(sorted(gold[i].arguments))
        new = _altered(gold[i].arguments[arg], _values_seen(domain, gold[i].name, arg), rng)
        altered = gold[i].model_copy(update={"arguments": {**gold[i].arguments, arg: new}})
        out[f"alter #{i} {gold[i].name}.{arg}={new!r:.60}"] = gold[:i] + [altered] + gold[i + 1:]
    pairs = [i for i in range(len(gold) - 1) if gold[i] != gold[i + 1]
             and (_is_write(domain, gold[i]) or _is_write(domain, gold[i + 1]))]
    if pairs:
        i = rng.choice(pairs)
        out[f"swap #{i} {gold[i].name} and #{i + 1} {gold[i + 1].name}"] = (
            gold[:i] + [gold[i + 1], gold[i]] + gold[i + 2:])
    return out


# -- rewards ------------------------------------------------------------------------------------------------------
def _checked_perturbations(domain, task) -> dict[str, list[Action]]:
    """All perturbations on telecom and mock (cheap); on airline and retail, whose native evaluation costs ~0.4-1 s,
    two of the three kinds per task in turn (every kind still runs on every third task or more)."""
    found = perturbations(domain, task)
    if domain in ("telecom", "mock"):
        return found
    skip = ("drop", "alter", "swap")[[t.id for t in load_tasks(domain, "test")].index(task.id) % 3]
    return {label: actions for label, actions in found.items() if not label.startswith(skip)}


@pytest.mark.parametrize("domain,task", TEST_TASKS, ids=_ids(TEST_TASKS))
def test_rewards_match_tau2_on_oracle_and_perturbed_replays(domain, task):
    episode, oracle = _assert_same_rewards(domain, task, gold_actions(task), "oracle")
    assert oracle[0] == "reward" and (domain == "mock" or oracle[1]["reward"] == 1.0)  # a mock task has no gold actions
    assert episode.env.get_db_hash() == get_dict_hash(episode.env.tools.db.model_dump())  # tau2's own hash
    for label, actions in _checked_perturbations(domain, task).items():
        assert actions != gold_actions(task)
        _assert_same_rewards(domain, task, actions, label)
    assert check_shared_records(domain), "a tool changed a shared record reached by iteration"


def test_perturbations_reach_both_outcomes():
    """The perturbed replays are not all scored alike: the checks above compare failing rewards too."""
    rewards = []
    for task in load_tasks("airline", "test"):  # all of them, also in the 1.0.1 pass (fast evaluation only)
        for actions in perturbations("airline", task).values():
            rewards.append(_replay("airline", task, actions).evaluate().reward)
    assert 0.0 in rewards and 1.0 in rewards and len(rewards) >= 30


# -- environments -------------------------------------------------------------------------------------------------
def test_environments_from_one_parsed_db_do_not_see_each_others_writes():
    a, b = fast_environment("airline"), fast_environment("airline")
    native_hash = registry.get_env_constructor("airline")().get_db_hash()
    assert a.tools.db.reservations.shared is b.tools.db.reservations.shared  # parsed once for both
    rid = next(r for r, res in a.tools.db.reservations.items() if res.status != "cancelled")
    result = a.get_response(ToolCall(id="1", name="cancel_reservation", arguments={"reservation_id": rid}))
    assert not result.error and a.tools.db.reservations[rid].status == "cancelled"
    a.tools.db.reservations["NEW001"] = a.tools.db.reservations[rid].model_copy(update={"reservation_id": "NEW001"})
    assert b.tools.db.reservations[rid].status != "cancelled" and "NEW001" not in b.tools.db.reservations
    assert b.get_db_hash() == native_hash != a.get_db_hash() == get_dict_hash(a.tools.db.model_dump())
    assert check_shared_records("airline")


def test_remembered_db_hashes_are_tau2s_for_every_kind_of_change():
    from tau2_rl_pipeline.benchmark.fast_env import _shared_dbs

    digests = _shared_dbs("retail")[0]._digests

    def states():  # a fresh view; one record looked up; one changed; one added; one removed
        env = fast_environment("retail")
        db = env.tools.db
        user_id = sorted(db.users)[3]
        yield env
        db.users[user_id]
        yield env
        db.users[user_id].address.city = "Elsewhere"
        yield env
        db.users["new_user_1"] = db.users[user_id].model_copy(update={"user_id": "new_user_1"})
        yield env
        db.orders.pop(sorted(db.orders)[0])
        yield env

    first = [(env.get_db_hash(), get_dict_hash(env.tools.db.model_dump())) for env in states()]
    assert all(ours == tau2s for ours, tau2s in first) and len({h for h, _ in first}) == 4  # a read changes nothing
    remembered = len(digests)
    again = [env.get_db_hash() for env in states()]  # new environments, the same changes: answered from memory
    assert again == [h for h, _ in first] and len(digests) == remembered


def test_telecom_environments_get_their_own_copies():
    a, b = fast_environment("telecom"), fast_environment("telecom")
    customer = a.tools.db.customers[0].customer_id
    a.tools.db.customers[0].full_name = "Changed Name"
    assert b.tools.db.customers[0].customer_id == customer and b.tools.db.customers[0].full_name != "Changed Name"
    assert a.get_db_hash() != b.get_db_hash() == registry.get_env_constructor("telecom")().get_db_hash()


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom", "mock"])
def test_fast_episode_shows_the_policy_the_same_prompt_and_tools(domain):
    task = load_tasks(domain, "base")[0]
    fast, native = Episode(domain, task, None, fast=True), Episode(domain, task, None)
    assert isinstance(fast.env.tools.db, type(native.env.tools.db))
    assert fast.system_prompt == native.system_prompt and fast.tools == native.tools
    if native.env.user_tools is not None:
        assert tool_schemas(fast.env.get_user_tools()) == tool_schemas(native.env.get_user_tools())


def test_fast_flag_picks_the_environment():
    task = load_tasks("retail", "test")[0]
    assert isinstance(Episode("retail", task, None, fast=True).env.tools.db.orders, CopyOnReadTable)
    assert not isinstance(Episode("retail", task, None).env.tools.db.orders, CopyOnReadTable)


def test_tools_run_on_their_own_environment():
    a, b = fast_environment("retail"), fast_environment("retail")
    order_id = next(iter(a.tools.db.orders))
    a.tools.db.orders[order_id].status = "cancelled"
    status = [json.loads(env.to_json_str(env.tools.get_tools()["get_order_details"](order_id=order_id)))["status"]
              for env in (a, b)]
    assert status == ["cancelled", registry.get_env_constructor("retail")().tools.db.orders[order_id].status]


def test_every_keyed_lookup_hands_out_the_environments_own_copy():
    users = fast_environment("retail").tools.db.users
    shared = users.shared.records
    user_id, other_id = list(shared)[:2]
    assert users.get(user_id) is users[user_id] is not shared[user_id] and users.get("nobody", 7) == 7
    users.setdefault(other_id).orders.append("#mine")
    popped = users.pop(other_id)
    assert popped.orders[-1] == "#mine" and "#mine" not in shared[other_id].orders and other_id not in users
    with pytest.raises(KeyError):
        users.pop(other_id)
    assert users.pop(other_id, None) is None and check_shared_records("retail")


def test_check_shared_records_sees_a_record_changed_through_iteration():
    env = fast_environment("mock")
    user = next(iter(env.tools.db.users.values()))  # the shared record: iteration does not copy
    name = user.name
    try:
        user.name = name + " (changed)"
        assert not check_shared_records("mock")
    finally:
        user.name = name
    assert check_shared_records("mock")


def test_unknown_domain_is_a_one_line_error():
    with pytest.raises(TaskLookupError, match="unknown domain 'nope'; valid domains: airline"):
        fast_environment("nope")
