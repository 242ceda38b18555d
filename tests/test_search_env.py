"""search-v0: the action parser, every branch of step, and check_env."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taurl.data.trajectory import ToolReceipt
from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task
from taurl.envs.search import SearchEnv, generate_tasks, parse_action
from taurl.envs.search.env import INVALID_OBSERVATION, NO_RESULTS, SEARCH_FAILED
from taurl.envs.search.retriever import Hit, shared_retriever
from taurl.errors import ConfigError, EnvCheckError, ResetNeeded
from taurl.reward import VERIFIER_VERSION


@pytest.fixture(scope="module")
def env(taurl_cache) -> SearchEnv:
    return SearchEnv()


@pytest.fixture(scope="module")
def capital_task() -> Task:
    return generate_tasks("train", n=1, seed=0, families=["city_country_capital"])[0]


TASK = Task("t-lyon", "In which country is the city of Lyon?", ("France",), "train", "search-v0")


# -- the parser --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("<think>hm</think><search> Lyon </search>", {"kind": "search", "query": "Lyon"}),
        ("<answer>France</answer>", {"kind": "answer", "answer": "France"}),
        # the last one
        ("<search>a</search> then <answer> b </answer>", {"kind": "answer", "answer": "b"}),
        ("<answer>x</answer><search>y</search>", {"kind": "search", "query": "y"}),
        ("<search>multi\nline</search>", {"kind": "search", "query": "multi\nline"}),
        ("<answer></answer>", {"kind": "answer", "answer": ""}),  # empty answer: answered, wrong
        ("France", {"kind": "invalid"}),  # no tag
        ("<lookup>Lyon</lookup>", {"kind": "invalid"}),  # unknown tag
        ("<search>Lyon", {"kind": "invalid"}),  # unclosed
        ("<search>Lyon</answer>", {"kind": "invalid"}),  # mismatched
        ("<search>   </search>", {"kind": "invalid"}),  # empty query
        ("", {"kind": "invalid"}),
    ],
)
def test_parse_action(text: str, parsed: dict[str, str]) -> None:
    assert parse_action(text) == parsed


_PIECES = st.sampled_from(["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>",
                           "<", ">", "/", " ", "\n", "Lyon", "São"])


@given(st.lists(_PIECES | st.text(max_size=8), max_size=20).map("".join))
def test_parser_never_raises_and_returns_a_known_kind(text: str) -> None:
    parsed = parse_action(text)
    assert parsed["kind"] in {"search", "answer", "invalid"}
    if parsed["kind"] == "search":
        assert parsed["query"] and parsed["query"] == parsed["query"].strip()
        assert parsed["query"] in text and "<search>" in text and "</search>" in text
    elif parsed["kind"] == "answer":
        assert parsed["answer"] == parsed["answer"].strip() and "</answer>" in text


# -- step, branch by branch --------------------------------------------------------------


def test_declarations(env) -> None:
    assert (env.name, env.observation_style, env.stop) == (
        "search-v0",
        "inline",
        ("</search>", "</answer>"),
    )
    assert env.version and [t["function"]["name"] for t in env.tools] == ["search"]
    for tag in ("<think>", "<search>", "<information>", "<answer>"):
        assert tag in env.system_prompt


def test_reset_and_search(env) -> None:
    obs, info = env.reset(TASK, seed=7)
    assert obs == "" and info["seed"] == 7 and info["env_version"] == env.version
    assert info["corpus_fingerprint"] == shared_retriever().fingerprint
    obs, reward, terminated, truncated, info = env.step(
        "<think>find it</think><search>Lyon</search>"
    )
    assert obs.startswith("\n\n<information>Doc 1(Title: Lyon) Lyon is a city in France.")
    assert obs.endswith("</information>\n\n") and obs.count("\nDoc ") == 2  # Doc 2 and Doc 3
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["action"] == {"kind": "search", "query": "Lyon"} and info["invalid"] is False
    receipt = info["receipt"]
    assert isinstance(receipt, ToolReceipt)
    assert (receipt.tool, receipt.arguments, receipt.decision, receipt.status) == (
        "search", {"query": "Lyon"}, "allowed", "ok",
    )
    assert receipt.latency_s >= 0 and receipt.output_chars > 0 and "error" not in info


def test_answer_right_and_wrong(env) -> None:
    env.reset(TASK)
    obs, reward, terminated, truncated, info = env.step("<answer> france. </answer>")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["stop_reason"] == "answered" and info["reward_components"] == {"outcome": 1.0}
    assert info["verifier_version"] == VERIFIER_VERSION and info["action"]["answer"] == "france."
    with pytest.raises(ResetNeeded):
        env.step("<answer>France</answer>")
    env.reset(TASK)
    assert env.step("<answer>Italy</answer>")[1:4] == (0.0, True, False)


@pytest.mark.parametrize(
    "action", ["France", "<lookup>Lyon</lookup>", "<search>Lyon", "<search> </search>"]
)
def test_invalid_actions_get_search_r1s_correction(env, action: str) -> None:
    env.reset(TASK)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == INVALID_OBSERVATION and obs.startswith(
        "\nMy previous action is invalid. If I want to search,"
    )
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert (
        info["invalid"] is True and info["action"] == {"kind": "invalid"} and "receipt" not in info
    )


def test_search_without_results(env) -> None:
    env.reset(TASK)
    obs, *_, info = env.step("<search>zzqxq</search>")
    assert (
        obs == f"\n\n<information>{NO_RESULTS}</information>\n\n" and info["receipt"].status == "ok"
    )


def test_max_turns_truncates_and_then_needs_reset(taurl_cache) -> None:
    env = SearchEnv(max_turns=2)
    with pytest.raises(ResetNeeded, match="call reset"):
        env.step("<search>Lyon</search>")
    env.reset(TASK)
    assert env.step("nothing")[2:4] == (False, False)
    obs, _, terminated, truncated, info = env.step("<search>Lyon</search>")
    assert (terminated, truncated, info["stop_reason"]) == (False, True, "max_turns")
    assert "<information>" in obs  # the last search still gets its results
    with pytest.raises(ResetNeeded):
        env.step("<answer>France</answer>")


def test_documents_are_truncated_to_max_doc_chars(taurl_cache) -> None:
    env = SearchEnv(top_k=1, max_doc_chars=40)
    env.reset(TASK)
    obs, *_, info = env.step("<search>France currency</search>")
    body = obs.removeprefix("\n\n<information>").removesuffix("</information>\n\n")
    assert body.endswith("...") and len(body) <= len("Doc 1(Title: France) ") + 40 + 3
    assert info["receipt"].truncated_output


class FlakyRetriever:
    """A real BM25 retriever behind a link that fails `failures` times, then works."""

    def __init__(self, failures: int):
        self.failures, self.inner = failures, shared_retriever()

    def search(self, query: str, k: int) -> list[Hit]:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("retrieval server unreachable")
        return self.inner.search(query, k)


def test_a_failing_retriever_does_not_crash_the_episode(taurl_cache) -> None:
    env = SearchEnv(retriever=FlakyRetriever(failures=1))
    env.reset(TASK)
    obs, reward, terminated, truncated, info = env.step("<search>Lyon</search>")
    assert obs == f"\n\n<information>{SEARCH_FAILED}</information>\n\n"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["error"] == "ConnectionError: retrieval server unreachable"
    assert info["receipt"].status == "error" and info["receipt"].reason == info["error"]
    obs, *_, info = env.step("<search>Lyon</search>")  # recovered
    assert "Doc 1(Title: Lyon)" in obs and "error" not in info


def test_a_retriever_that_keeps_failing_ends_the_episode_as_an_error(taurl_cache) -> None:
    env = SearchEnv(retriever=FlakyRetriever(failures=10), max_search_errors=2)
    env.reset(TASK)
    assert env.step("<search>Lyon</search>")[2:4] == (False, False)
    *_, terminated, truncated, info = env.step("<search>Lyon</search>")
    assert (terminated, truncated, info["stop_reason"]) == (False, True, "error") and info["error"]


def test_a_two_hop_episode_end_to_end(env, capital_task) -> None:
    meta = capital_task.metadata
    env.reset(capital_task, seed=0)
    first = env.step(f"<search>{meta['subject']}</search>")[0]
    assert meta["bridge"] in first
    second = env.step(f"<search>{meta['bridge']} capital</search>")[0]
    assert any(a in second for a in capital_task.answers)
    assert env.step(f"<answer>{capital_task.answers[0]}</answer>")[1:4] == (1.0, True, False)


def test_bad_config_and_foreign_tasks_are_refused(env) -> None:
    with pytest.raises(ConfigError, match="top_k must be an integer >= 1") as e:
        SearchEnv(top_k=0, max_turns=0, retriever=object())
    assert len(e.value.problems) == 3
    with pytest.raises(ConfigError, match="not 'search-v0'"):
        env.reset(Task("t", "q", ("a",), "train", "code-v0"))


def test_envs_share_one_retriever(env) -> None:
    assert SearchEnv().retriever is env.retriever is shared_retriever()


# -- check_env ---------------------------------------------------------------------------


def test_check_env_passes_on_search_env(taurl_cache, capital_task) -> None:
    actions = ["<search>Lyon</search>", "garbage", f"<answer>{capital_task.answers[0]}</answer>"]
    check_env(SearchEnv(), capital_task, actions)
    check_env(SearchEnv(max_turns=3), capital_task)  # the default actions


class ToyEnv:
    """A small correct env; each test below breaks one rule of the protocol."""

    name, version, observation_style, stop, system_prompt = "toy-v0", "1", "inline", ("</a>",), ""
    verifier_version = "toy-v1"
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "Echo.",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "string"}},
                    "required": ["x"],
                },
            },
        }
    ]

    def __init__(self) -> None:
        self.turn, self.live = 0, False

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.turn, self.live = 0, True
        return "", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self.live:
            raise ResetNeeded("reset first")
        self.turn += 1
        self.live = self.turn < 2
        info: dict[str, Any] = {"action": {"kind": "say"}, "invalid": False}
        if not self.live:
            info["stop_reason"] = "max_turns"
        return f"obs {self.turn}", 0.0, False, not self.live, info


class BadName(ToyEnv):
    name = "Toy"


class BadTool(ToyEnv):
    tools = [
        {
            "type": "function",
            "function": {"name": "echo", "description": "Echo.", "parameters": {"type": "array"}},
        }
    ]


class NoResetCheck(ToyEnv):
    def __init__(self) -> None:
        super().__init__()
        self.live = True


class BothFlags(ToyEnv):
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, r, _, truncated, info = super().step(action)
        return obs, r, truncated, truncated, info


class Endless(ToyEnv):
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, r, *_, info = super().step(action)
        self.live = True
        return obs, r, False, False, {"action": {"kind": "say"}, "invalid": False}


class Unseeded(ToyEnv):
    calls = 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        Unseeded.calls += 1
        super().reset(task, seed)
        return f"state {Unseeded.calls}", {}


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (BadName, "must look like 'family-vN'"),
        (BadTool, '"type": "object"'),
        (NoResetCheck, "step before reset must raise"),
        (BothFlags, "both true"),
        (Endless, "did not end within 100 steps"),
        (Unseeded, "same seed and actions gave different results at step 0"),
    ],
)
def test_check_env_catches_each_broken_rule(cls: type[ToyEnv], message: str) -> None:
    assert isinstance(cls(), Env)
    check_env(ToyEnv(), TASK)
    with pytest.raises(EnvCheckError, match=message.replace("(", r"\(")):
        check_env(cls(), TASK)
