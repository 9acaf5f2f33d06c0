"""Every catalog price carries a source that names a cloud, an instance, a region, a URL and a
date, and the price is that instance's list price over its GPUs (issue 19: catalog prices as
defaults with their date and source, one consistent price source per cloud).  A recalled figure
cannot come in without one: the only exceptions are listed here by name."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.catalog.price_source import UNVERIFIED_PREFIX, parse_price_source

# Figures no stored page backed when the prices were re-sourced (issue 19); each keeps its old
# source behind UNVERIFIED_PREFIX.  Adding a GPU here is a visible decision in review.
NOT_RE_VERIFIED = {"RTX3090-24GB", "RTX4090-24GB", "MI300X-192GB"}
CLOUDS = {"AWS", "Azure", "GCP", "Lambda", "RunPod", "OCI"}
# The default cloud wherever it rents the GPU, so that a mixed cluster's defaults compare.
DEFAULT_CLOUD = "AWS"
# Catalog prices are written to 4 decimals of the quotient instance price / GPUs.
PRICE_ROUNDING_USD = 5e-5


def _priced():
    return [g for g in catalog.gpus().values() if g.price_per_hour_usd is not None]


@pytest.mark.parametrize("gpu", _priced(), ids=lambda g: g.name)
def test_every_catalog_price_names_cloud_region_url_and_date(gpu):
    text = gpu.sources.get("price_per_hour", "")
    if gpu.name in NOT_RE_VERIFIED:
        assert text.startswith(UNVERIFIED_PREFIX), text
        return
    source = parse_price_source(text)
    assert source is not None, f"{gpu.name}: source not in the catalog format: {text!r}"
    assert source.cloud in CLOUDS
    assert source.region and source.url.startswith("https://")
    assert source.date  # an ISO date or "date not stated", by the format
    assert gpu.price_per_hour_usd == pytest.approx(source.usd_per_gpu_hour, abs=PRICE_ROUNDING_USD)


def test_one_price_source_and_one_region_per_cloud():
    by_cloud: dict[str, set[tuple[str, str, str]]] = {}
    for gpu in _priced():
        source = parse_price_source(gpu.sources["price_per_hour"])
        if source is not None:
            by_cloud.setdefault(source.cloud, set()).add((source.url, source.region, source.date))
    assert DEFAULT_CLOUD in by_cloud
    assert all(len(found) == 1 for found in by_cloud.values()), by_cloud


def test_the_unverified_list_holds_only_figures_still_unverified():
    """An entry re-sourced later must leave NOT_RE_VERIFIED, so the list only shrinks."""
    gpus = catalog.gpus()
    for gid in NOT_RE_VERIFIED:
        assert gpus[gid].price_per_hour_usd is not None, gid
        assert parse_price_source(gpus[gid].sources["price_per_hour"]) is None, gid


def test_a_null_price_says_why():
    for gpu in catalog.gpus().values():
        if gpu.price_per_hour_usd is None:
            assert gpu.sources.get("price_per_hour", "").startswith("null"), gpu.name


@pytest.mark.parametrize("text", [
    # no region, no URL, no date: the recalled form this format replaced
    "AWS p4de.24xlarge (8x A100 80GB) on-demand 40.96 USD/h / 8 = 5.12, us-east-1; recalled",
    "AWS p4de.24xlarge on-demand 27.44705 / 8 GPUs, us-east-1, 2026-08-26",                   # no URL
    "AWS p4de.24xlarge on-demand 27.44705 / 8 GPUs, us-east-1, https://example.org/p.json",   # no date
    "AWS p4de.24xlarge on-demand 27.44705 / 0 GPUs, us-east-1, https://example.org/p.json, 2026-08-26",
    "AWS p4de.24xlarge on-demand 27.44705 / 8 GPUs, https://example.org/p.json, 2026-08-26",  # no region
])
def test_the_parser_refuses_a_source_missing_a_part(text):
    assert parse_price_source(text) is None


def test_the_parser_reads_every_part():
    source = parse_price_source("Lambda 1x NVIDIA GH200 on-demand 2.29 / 1 GPU, region not stated, "
                                "https://example.org/lambda.yml, 2026-09-20; transcribed")
    assert source is not None
    assert (source.cloud, source.instance, source.instance_usd_per_hour, source.gpus_per_instance) == (
        "Lambda", "1x NVIDIA GH200", 2.29, 1)
    assert (source.region, source.url, source.date, source.note) == (
        "region not stated", "https://example.org/lambda.yml", "2026-09-20", "transcribed")
