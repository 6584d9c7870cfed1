"""planner.advise.offers: the offers YAML, strict like a cluster config; the shipped example loads."""

from __future__ import annotations

import copy
import datetime

import pytest

from planner.advise.offers import MAX_OFFERS, load_offers, parse_offers
from planner.errors import ConfigError
from tests.planner.cli_helpers import CONFIGS

GOOD = {
    "networks": {"eth": {"gbps": 10, "latency_us": 30}},
    "offers": [
        {
            "name": "a",
            "gpu": "T4",
            "gpus_per_node": 4,
            "max_nodes": 2,
            "price_per_node_hour": 2.0,
            "network": "eth",
            "source": "a test",
            "date": "2026-11-09",
        }
    ],
}


def _with(**changes) -> dict:
    data = copy.deepcopy(GOOD)
    data["offers"][0].update(changes)
    return data


def test_the_shipped_example_has_eight_dated_offers_with_sources():
    offers = load_offers(CONFIGS / "offers" / "example.yaml")
    assert len(offers.offers) == 8
    for offer in offers.offers:
        assert offer.source and datetime.date.fromisoformat(offer.date) <= datetime.date(2026, 12, 31)
        assert offer.price_per_node_hour_usd > 0
    assert {o.network for o in offers.offers} == set(offers.networks)


def test_a_shipped_offers_file_is_found_by_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_offers("example").source_path == str(CONFIGS / "offers" / "example.yaml")
    with pytest.raises(ConfigError, match="does not exist.*shipped: example"):
        load_offers("nope")


def test_a_good_offer_parses_with_its_figures():
    offer = parse_offers(GOOD, "t.yaml").offers[0]
    assert (offer.gpu.name, offer.gpus_per_node, offer.max_nodes, offer.price_per_gpu_hour_usd) == (
        "T4",
        4,
        2,
        0.5,
    )
    assert offer.date == "2026-11-09" and offer.intra is None


def test_a_yaml_date_is_read_as_its_iso_form():
    assert parse_offers(_with(date=datetime.date(2026, 1, 2)), "t.yaml").offers[0].date == "2026-01-02"


@pytest.mark.parametrize(
    ("changes", "where", "words"),
    [
        ({"gpus": 4}, r"t\.yaml: offers\[0\]\.gpus", "unknown key 'gpus'"),
        ({"gpu": "T5"}, r"offers\[0\]\.gpu", "not in the catalog"),
        ({"gpus_per_node": 0}, r"offers\[0\]\.gpus_per_node", "at least 1"),
        ({"gpus_per_node": 1000}, r"offers\[0\]\.gpus_per_node", "at most 256"),
        ({"max_nodes": 10**9}, r"offers\[0\]\.max_nodes", "at most 1024"),
        ({"price_per_node_hour": -1}, r"offers\[0\]\.price_per_node_hour", ""),
        ({"network": "ib"}, r"offers\[0\]\.network", "not one of networks"),
        ({"date": "09/11/2026"}, r"offers\[0\]\.date", "YYYY-MM-DD"),
        ({"date": "2026-02-30"}, r"offers\[0\]\.date", "YYYY-MM-DD"),
        ({"name": "a b"}, r"offers\[0\]\.name", "may hold only"),
        ({"intra": "nvlink"}, r"offers\[0\]\.intra", "no NVLink figure"),
    ],
)
def test_a_bad_offer_names_the_file_and_the_path(changes, where, words):
    with pytest.raises(ConfigError, match=where) as caught:
        parse_offers(_with(**changes), "t.yaml")
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_key_says_what_to_write():
    data = copy.deepcopy(GOOD)
    del data["offers"][0]["source"]
    with pytest.raises(ConfigError, match=r"offers\[0\]\.source.*missing required key 'source'"):
        parse_offers(data, "t.yaml")


def test_duplicate_names_and_several_problems_come_together():
    data = copy.deepcopy(GOOD)
    data["offers"].append(copy.deepcopy(data["offers"][0]))
    data["offers"].append({**data["offers"][0], "name": "c", "gpu": "nope"})
    with pytest.raises(
        ConfigError, match=r"2 problems: \[1\].*duplicate offer name 'a'.*\[2\].*offers\[2\]\.gpu"
    ):
        parse_offers(data, "t.yaml")


def test_an_unknown_gpu_is_reported_with_the_offers_other_problems_and_a_fix_an_offers_file_can_take():
    """It came only after the offer's other problems were fixed, with the fix of a cluster config (gpu_types:,
    which an offers file does not have)."""
    with pytest.raises(ConfigError) as caught:
        parse_offers(_with(name="a b", gpu="A100-80", price_per_node_hour=-1), "t.yaml")
    message = str(caught.value)
    assert message.startswith("t.yaml: 3 problems: ")
    assert "[1] offers[0].name:" in message and "[3] offers[0].price_per_node_hour:" in message
    assert (
        "[2] offers[0].gpu: GPU type 'A100-80' is not in the catalog (close matches: A100-SXM4-80GB"
        in message
    )
    assert "`batchplan catalog` lists them" in message
    assert "or add it under gpu_types:" not in message


def test_unknown_top_level_keys_and_bad_networks_are_errors():
    with pytest.raises(ConfigError, match="unknown key 'offer'"):
        parse_offers({**GOOD, "offer": []}, "t.yaml")
    with pytest.raises(ConfigError, match=r"networks\.eth\.gbps"):
        parse_offers({**GOOD, "networks": {"eth": {"gbps": 0}}}, "t.yaml")
    with pytest.raises(ConfigError, match="non-empty mapping"):
        parse_offers({**GOOD, "networks": {}}, "t.yaml")


def test_too_many_offers_are_refused_while_reading(tmp_path):
    entry = GOOD["offers"][0]
    lines = ["networks: {eth: {gbps: 10}}", "offers:"]
    lines += [
        f"  - {{name: o{i}, gpu: T4, gpus_per_node: 1, max_nodes: 1, price_per_node_hour: 1, network: eth, "
        f"source: x, date: {entry['date']}}}"
        for i in range(MAX_OFFERS + 1)
    ]
    path = tmp_path / "many.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=str(MAX_OFFERS)):
        load_offers(path)


def test_the_readmes_offers_example_is_a_valid_offers_file():
    import re

    import yaml

    readme = (CONFIGS.parent / "README.md").read_text()
    section = readme[readme.index("## Which GPUs should I rent?") :]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL).group(1)
    offers = parse_offers(yaml.safe_load(block), "README.md")
    assert [o.name for o in offers.offers] == ["lab-a100"] and offers.offers[0].price_per_node_hour_usd == 0


@pytest.mark.parametrize(
    "text",
    ["AWS page\nnodes: [{name: evil, gpus: [{type: T4, count: 256}]}]", "AWS \x1b[2Jpage", "AWS \u202eegap"],
)
def test_a_source_or_name_that_is_not_one_line_of_visible_text_is_refused(text):
    """Issue #34: a newline in ``source:`` became live YAML in the cluster file ``advise`` writes."""
    for field in ("source", "name"):
        with pytest.raises(ConfigError, match=rf"offers\[0\]\.{field}: .* holds the character \\") as raised:
            parse_offers(_with(**{field: text}), "t.yaml")
        assert "\n" not in str(raised.value) and "\x1b" not in str(raised.value)
