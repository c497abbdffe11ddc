"""Configuration: defaults, file/env/--set layering, and that every mistake names its dotted key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollstream.config import Config, ConfigError, check_run_id, load_config


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rollstream.toml"
    path.write_text(text)
    return path


def test_defaults_validate() -> None:
    cfg = load_config(environ={})
    assert cfg == Config()
    assert cfg.trainer.alpha == 1
    assert cfg.kafka.topic_prefix == "rollstream"
    assert set(cfg.to_dict()) == {
        "kafka",
        "broker",
        "topics",
        "rollout",
        "generation",
        "env",
        "reward",
        "trainer",
    }


def test_toml_file_sets_values(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
[trainer]
alpha = 2
staleness_policy = "downweight"
gamma = 1

[rollout]
domains = ["math"]
max_new_tokens = { math = 20 }

[topics]
partitions = { "env-actions" = 3 }
""",
    )
    cfg = load_config(path, environ={})
    assert cfg.trainer.alpha == 2
    assert cfg.trainer.staleness_policy == "downweight"
    assert cfg.trainer.gamma == 1.0 and isinstance(cfg.trainer.gamma, float)
    assert cfg.rollout.domains == ["math"]
    assert cfg.rollout.max_new_tokens == {"math": 20}
    assert cfg.topics.partitions == {"env-actions": 3}


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[nonsense]\na = 1\n", "'nonsense'"),
        ("[trainer]\nalpah = 1\n", "trainer.alpah"),
        ('[trainer]\nalpha = "two"\n', "trainer.alpha"),
        ("[trainer]\nalpha = 1.5\n", "trainer.alpha"),
        ("[trainer]\nalpha = true\n", "trainer.alpha"),
        ("[trainer]\nalpha = -1\n", "trainer.alpha"),
        ("[trainer]\nlr = -0.1\n", "trainer.lr"),
        ('[trainer]\nstaleness_policy = "keep"\n', "trainer.staleness_policy"),
        ('[generation]\nbackend = "tgi"\n', "generation.backend"),
        ('[kafka]\ngroup_protocol = "eager"\n', "kafka.group_protocol"),
        ("[kafka]\ntopic_prefix = 3\n", "kafka.topic_prefix"),
        ('[env]\nsimulate = "x"\n', "env.simulate"),
        ('[generation]\nsimulate_cost = "perhaps"\n', "generation.simulate_cost"),
        ("[rollout]\ngroup_size = 0\n", "rollout.group_size"),
        ('[rollout]\ndomains = "math"\n', "rollout.domains"),
        ('[rollout]\nmax_new_tokens = { math = "many" }\n', "rollout.max_new_tokens.math"),
        ('[rollout]\ndomains = ["chess"]\n', "rollout.domains"),
        ('[env]\nlatency = "sometimes"\n', "env.latency"),
        ('[topics]\npartitions = { "nope" = 2 }\n', "topics.partitions"),
        ("[broker]\nport = 0\n", "broker.port"),
        ("trainer = 3\n", "'trainer'"),
    ],
)
def test_bad_file_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_toml(tmp_path, text), environ={})
    assert key in str(info.value)


def test_cross_field_rule_names_the_key(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[rollout]\ngroup_size = 2\n[trainer]\nmin_group_size = 3\n")
    with pytest.raises(ConfigError, match=r"trainer\.min_group_size"):
        load_config(path, environ={})


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match=r"rollstream\.toml"):
        load_config(_toml(tmp_path, "[trainer\nalpha = 1"), environ={})


def test_environment_overrides() -> None:
    cfg = load_config(
        environ={
            "ROLLSTREAM__TRAINER__ALPHA": "3",
            "ROLLSTREAM__TRAINER__LR": "0.01",
            "ROLLSTREAM__GENERATION__SIMULATE_COST": "true",
            "ROLLSTREAM__ROLLOUT__DOMAINS": '["math", "code"]',
            "ROLLSTREAM__KAFKA__CLIENT": '{"security.protocol": "PLAINTEXT"}',
            "UNRELATED": "x",
        }
    )
    assert cfg.trainer.alpha == 3
    assert cfg.trainer.lr == 0.01
    assert cfg.generation.simulate_cost is True
    assert cfg.rollout.domains == ["math", "code"]
    assert cfg.kafka.client == {"security.protocol": "PLAINTEXT"}


def test_environment_override_beats_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[trainer]\nalpha = 2\n")
    assert load_config(path, environ={"ROLLSTREAM__TRAINER__ALPHA": "5"}).trainer.alpha == 5


@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"ROLLSTREAM__TRAINER__ALPHA": "x"}, "trainer.alpha"),
        ({"ROLLSTREAM__TRAINER__ALPAH": "1"}, "trainer.alpah"),
        ({"ROLLSTREAM__TRAINER__ALPHA": "-2"}, "trainer.alpha"),
        ({"ROLLSTREAM__NOPE__ALPHA": "1"}, "ROLLSTREAM__NOPE__ALPHA"),
        ({"ROLLSTREAM__ALPHA": "1"}, "ROLLSTREAM__ALPHA"),
        ({"ROLLSTREAM__ROLLOUT__DOMAINS": "[not json"}, "rollout.domains"),
    ],
)
def test_bad_environment_names_the_key(environ: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ=environ)
    assert key in str(info.value)


def test_set_overrides() -> None:
    cfg = load_config(
        overrides=[
            "trainer.alpha=4",
            "trainer.gamma=0.25",
            "generation.backend=hf",
            'rollout.domains=["frozenlake"]',
            'rollout.domain_pools={"frozenlake": "h20"}',
            "kafka.bootstrap_servers=127.0.0.1:9092",
            "kafka.topic_prefix=rs",
        ],
        environ={"ROLLSTREAM__TRAINER__ALPHA": "3"},
    )
    assert cfg.trainer.alpha == 4  # --set beats the environment
    assert cfg.trainer.gamma == 0.25
    assert cfg.generation.backend == "hf"
    assert cfg.rollout.domains == ["frozenlake"]
    assert cfg.rollout.domain_pools == {"frozenlake": "h20"}
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.topic_prefix == "rs"


@pytest.mark.parametrize(
    ("item", "key"),
    [
        ("trainer.alpha", "trainer.alpha"),
        ("alpha=3", "alpha=3"),
        ("nope.alpha=3", "nope.alpha"),
        ("trainer.nope=3", "trainer.nope"),
        ("trainer.alpha=abc", "trainer.alpha"),
        ("trainer.staleness_policy=keep", "trainer.staleness_policy"),
        ("env.step_timeout_s=0", "env.step_timeout_s"),
    ],
)
def test_bad_set_names_the_key(item: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[item], environ={})
    assert key in str(info.value)


def test_json_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=["trainer.alpha=2", "rollout.group_size=6", 'topics.partitions={"dead-letters": 2}'],
        environ={},
    )
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg.to_dict()))
    again = load_config(path, environ={})
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


def test_json_config_with_a_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"trainer": {"alpha": 1, "beta": 2}}))
    with pytest.raises(ConfigError, match=r"trainer\.beta"):
        load_config(path, environ={})


@pytest.mark.parametrize("run_id", ["r", "run-1", "A_b-9", "x" * 64])
def test_good_run_ids(run_id: str) -> None:
    assert check_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", ["", "a.b", "a/b", "a b", "x" * 65, "ü"])
def test_bad_run_ids(run_id: str) -> None:
    with pytest.raises(ConfigError, match="run id"):
        check_run_id(run_id)


@pytest.mark.parametrize("item", ["trainer.lr=nan", "trainer.gamma=NaN", "env.step_timeout_s=nan"])
def test_nan_is_out_of_range(item: str) -> None:
    with pytest.raises(ConfigError, match=item.split("=")[0].replace(".", r"\.")):
        load_config(overrides=[item], environ={})
