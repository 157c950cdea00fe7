"""AgentOptions: one place for every agent option's default, checked wherever options enter."""

from __future__ import annotations

import argparse
import re

import pytest

from diag import agent
from diag.agent.options import DEFAULTS, AgentOptions
from diag.agent.registry import ALL_COLLECTORS, OptionError
from diag.cli import agent_options
from diag.cli import run as run_cmd


def test_a_typo_is_refused_naming_the_nearest_option(tmp_path) -> None:
    with pytest.raises(OptionError, match=r"layer_every is not an agent option; did you mean layers_every\?"):
        agent.start(str(tmp_path), what=("steps",), layer_every=1)
    assert agent.current() is None


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"flops_every": 0}, "flops_every must be >= 1, got 0"),
        ({"layers_every": -1}, "layers_every must be >= 0, got -1"),
        ({"ring_capacity": "10"}, "ring_capacity must be an integer, got '10'"),
        ({"attribute_every": True}, "attribute_every must be an integer, got True"),
        ({"self_time": "yes"}, "self_time must be true or false, got 'yes'"),
        ({"faults": {"comms": 1}}, "faults must map collector names to actions"),
        ({"what": 5}, "what must be collector names, got 5"),
        ({"what": ["steps", 5]}, "what must name collectors as strings, got 5"),
        (
            {"what": "steps,layres"},
            "unknown collector(s) layres; choose from steps, layers, comms, memory, "
            "overflow; did you mean layers?",
        ),
    ],
)
def test_bad_values_are_refused(kw, message) -> None:
    with pytest.raises(OptionError) as err:
        AgentOptions.from_mapping(kw)
    assert message in str(err.value)


def test_defaults_and_the_layers_rule() -> None:
    assert AgentOptions.from_mapping({}) == DEFAULTS and DEFAULTS.what == ALL_COLLECTORS
    off = AgentOptions.from_mapping({"what": "comms"})
    assert off.what == ("steps", "comms") and off.layers_every == 0  # no sampled steps unasked
    assert AgentOptions.from_mapping({"what": "comms", "layers_every": 7}).layers_every == 7


def test_start_takes_its_options_through_the_dataclass(tmp_path) -> None:
    ag = agent.start(str(tmp_path), what="steps", flops_every=2)
    try:
        assert ag.options == AgentOptions(
            trace_dir=str(tmp_path), what=("steps",), layers_every=0, flops_every=2
        )
        assert ag.layers_every == 0 and ag.trace_dir == str(tmp_path)
    finally:
        agent.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    run_cmd.add_arguments(parser)
    return parser


def test_cli_help_states_the_dataclass_defaults() -> None:
    helps = {a.option_strings[-1]: a.help or "" for a in _parser()._actions if a.option_strings}
    for flag, name in (("--layers-every", "layers_every"), ("--flops-every", "flops_every")):
        said = re.search(r"\(default (\d+)", helps[flag])
        assert said is not None, flag
        assert int(said.group(1)) == getattr(DEFAULTS, name)
    assert f"(default: {','.join(DEFAULTS.what)})" in helps["--what"]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--what", "comms,memory"],
        ["--what", "steps", "--layers-every", "3", "--flops-every", "2", "--self-time"],
    ],
)
def test_run_environment_round_trips(argv, tmp_path) -> None:
    args = _parser().parse_args(["--trace-dir", str(tmp_path), *argv, "--", "python", "train.py"])
    sent = agent_options.build(args)
    got = AgentOptions.from_json(run_cmd.environment(args, {})["DIAG_RUN"])
    assert got == sent and got.trace_dir == str(tmp_path)
    assert AgentOptions.from_mapping(sent.to_mapping()) == sent


def test_every_option_round_trips() -> None:
    opts = AgentOptions(
        trace_dir="/x",
        what=("steps", "comms"),
        layers_every=9,
        attribute_every=0,
        flops_every=3,
        ring_capacity=5,
        self_time=True,
        memory_reset_peak=True,
        faults={"comms": "raise"},
        control=True,
    )
    assert AgentOptions.from_json(opts.to_json()) == opts


def test_a_bad_environment_is_refused() -> None:
    with pytest.raises(OptionError, match="must be a JSON object"):
        AgentOptions.from_json("[1]")
