"""Cluster, model and training specs: good ones load, bad ones give one clear located error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.errors import InputError
from planner.spec import load_cluster, load_model, load_training
from planner.spec.units import UnitError, parse_bandwidth_Bps, parse_size_bytes, parse_time_s

EXAMPLES = sorted(Path(__file__).parent.parent.joinpath("cluster_specs").glob("*.yaml"))

GOOD = """\
name: t
zones:
  - {name: a}
  - {name: b}
nodes:
  - {name: x, count: 2, zone: a, gpu: A100-SXM4-80GB, gpus_per_node: 8, network_bandwidth: 800 Gbit/s}
  - {name: y, zone: b, gpu: v100-sxm2-32gb, gpus_per_node: 4, network_bandwidth: 100 Gbps}
links:
  - {between: [a, b], bandwidth: 10 Gbit/s, latency: 30 ms}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path):
    cluster = load_cluster(path)
    assert cluster.num_gpus > 0


def test_good_cluster_resolves_defaults(tmp_path):
    cluster = load_cluster(write(tmp_path, GOOD))
    assert [n.name for n in cluster.node_list] == ["x-0", "x-1", "y"]
    assert cluster.num_gpus == 20
    y = cluster.node_by_name["y"]
    assert y.gpu.name == "V100-SXM2-32GB"  # case-insensitive catalog match
    assert y.group.network_Bps == pytest.approx(100e9 / 8)
    assert cluster.link("b", "a").latency_s == pytest.approx(0.03)
    assert cluster.node_by_name["x-0"].group.intra_Bps == cluster.node_by_name["x-0"].gpu.intra_node_bandwidth_Bps


def test_units():
    assert parse_bandwidth_Bps("10 Gbit/s") == pytest.approx(1.25e9)
    assert parse_bandwidth_Bps("10 Gbps") == pytest.approx(1.25e9)
    assert parse_bandwidth_Bps("300 GB/s") == pytest.approx(3e11)
    assert parse_size_bytes("96 GiB") == 96 * 2**30
    assert parse_time_s("30 ms") == pytest.approx(0.03)
    for bad in ("10", 10, "10 furlongs", "-5 Gbit/s", "0 GB/s", "nan Gbit/s"):
        with pytest.raises(UnitError):
            parse_bandwidth_Bps(bad)


BAD_CASES = {
    "missing field": (GOOD.replace(", gpus_per_node: 4", ""), "7:", "gpus_per_node"),
    "unknown key": (GOOD.replace("count: 2,", "count: 2, colour: red,"), "6:", "unknown key 'colour'"),
    "duplicate key": (GOOD.replace("name: t\n", "name: t\nname: u\n"), "2:1", "duplicate key 'name'"),
    "bare number": (GOOD.replace("800 Gbit/s", "800"), "6:", "needs a unit"),
    "wrong unit": (GOOD.replace("10 Gbit/s", "10 parsecs"), "9:", "unknown bandwidth unit"),
    "zero bandwidth": (GOOD.replace("10 Gbit/s", "0 Gbit/s"), "9:", "positive"),
    "negative bandwidth": (GOOD.replace("100 Gbps", "-100 Gbps"), "7:", "positive"),
    "nan": (GOOD.replace("gpus_per_node: 8", "gpus_per_node: .nan"), "6:", "finite"),
    "unknown gpu": (GOOD.replace("A100-SXM4-80GB", "B300"), "6:", "unknown GPU type 'B300'"),
    "unknown link zone": (GOOD.replace("[a, b]", "[a, c]"), "9:", "link to unknown zone or region 'c'"),
    "node in unknown zone": (GOOD.replace("zone: b", "zone: q"), "7:", "unknown zone 'q'"),
    "no link": (GOOD.replace("links:\n  - {between: [a, b], bandwidth: 10 Gbit/s, latency: 30 ms}\n", ""),
                "", "no link joins them"),
    "duplicate node names": (GOOD.replace("name: y", "name: x"), "7:", "duplicate node name"),
    "inline gpu missing figure": (GOOD.replace("gpu: A100-SXM4-80GB", "gpu: {name: mine, memory: 24 GB}"),
                                  "6:", "peak_tflops"),
    "yaml syntax": ("name: [t\n", "", "YAML syntax"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_cluster_is_one_located_error(tmp_path, case, capsys):
    text, where, needle = BAD_CASES[case]
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_cluster(path)
    message = str(info.value)
    assert needle in message
    # One problem, one message (the inline GPU lacks three figures: three problems).
    assert len(message.splitlines()) == (3 if case == "inline gpu missing figure" else 1), message
    assert f"{path}:{where}" in message
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err


def test_inline_gpu(tmp_path):
    text = GOOD.replace("gpu: A100-SXM4-80GB", "gpu: {name: mine, memory: 24 GB, peak_tflops: 100, "
                        "memory_bandwidth: 900 GB/s, intra_node_bandwidth: 32 GB/s}")
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.node_by_name["x-0"].gpu.peak_flops == pytest.approx(1e14)


def test_inline_gpu_without_nic_needs_network_bandwidth(tmp_path):
    text = GOOD.replace("gpu: A100-SXM4-80GB, gpus_per_node: 8, network_bandwidth: 800 Gbit/s",
                        "gpu: {name: mine, memory: 24 GB, peak_tflops: 100, memory_bandwidth: 900 GB/s, "
                        "intra_node_bandwidth: 32 GB/s}, gpus_per_node: 8")
    with pytest.raises(InputError, match="network_bandwidth is missing"):
        load_cluster(write(tmp_path, text))


def test_missing_file_is_input_error(tmp_path):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2


def test_models(tmp_path):
    m = load_model("LLAMA3-70B")
    assert m.kv_heads == 8 and m.mlp == "swiglu"
    path = tmp_path / "m.yaml"
    path.write_text("num_layers: 4\nhidden_size: 64\nnum_attention_heads: 3\nvocab_size: 100\n")
    with pytest.raises(InputError, match="must divide hidden_size"):
        load_model(path)
    with pytest.raises(InputError, match="neither a catalog model"):
        load_model("no-such-model")


def test_training(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("global_batch_size: 64\nseq_len: 2048\nprecision: fp8\n")
    with pytest.raises(InputError, match="precision"):
        load_training(path)
    path.write_text("global_batch_size: 64\nseq_len: 2048\nschedules: [1f1b]\n")
    assert load_training(path).schedules == ("1f1b",)


def test_one_gpu_name_one_gpu(tmp_path):
    inline = ("gpu: {name: %s, memory: 24 GB, peak_tflops: %d, memory_bandwidth: 900 GB/s, "
              "intra_node_bandwidth: 32 GB/s}")
    text = (GOOD.replace("gpu: A100-SXM4-80GB", inline % ("mine", 10))
            .replace("gpu: v100-sxm2-32gb", inline % ("mine", 1000)))
    with pytest.raises(InputError, match="two different GPUs are named 'mine'"):
        load_cluster(write(tmp_path, text))
    text = GOOD.replace("gpu: A100-SXM4-80GB", inline % ("A100-SXM4-80GB", 10))
    with pytest.raises(InputError, match="which is the catalog's A100-SXM4-80GB with other figures"):
        load_cluster(write(tmp_path, text))
    same = GOOD.replace("gpu: A100-SXM4-80GB", inline % ("mine", 10)).replace(
        "gpu: v100-sxm2-32gb", inline % ("MINE", 10))
    assert load_cluster(write(tmp_path, same)).num_gpus == 20


def test_inline_gpu_errors_are_reported_once(tmp_path):
    text = GOOD.replace("gpu: A100-SXM4-80GB", "gpu: {name: mine, memory: 24 GB}")
    with pytest.raises(InputError) as info:
        load_cluster(write(tmp_path, text))
    lines = str(info.value).splitlines()
    assert len(lines) == len(set(lines)) == 3  # peak_tflops, memory_bandwidth, intra_node_bandwidth


def test_microsecond_sign_parses():
    assert parse_time_s("5 µs") == pytest.approx(5e-6)


def test_links_may_join_regions(tmp_path):
    text = """\
name: regions
zones:
  - {name: a1, region: east}
  - {name: a2, region: east}
  - {name: b1, region: west}
nodes:
  - {name: x, zone: a1, gpu: A100-SXM4-80GB, gpus_per_node: 8}
  - {name: y, zone: a2, gpu: A100-SXM4-80GB, gpus_per_node: 8}
  - {name: z, zone: b1, gpu: A100-SXM4-80GB, gpus_per_node: 8}
links:
  - {between: [a1, a2], bandwidth: 100 Gbit/s, latency: 1 ms}
  - {between: [east, west], bandwidth: 5 Gbit/s, latency: 40 ms}
"""
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.link("a2", "b1").latency_s == pytest.approx(0.04)   # via the regions
    assert cluster.link("a1", "a2").latency_s == pytest.approx(0.001)  # the zones' own link
    from planner.topology import Topology

    path = Topology(cluster).p2p("y:0", "z:0")
    assert path.kind == "zone-link" and path.bandwidth_Bps == pytest.approx(5e9 / 8)
    bad = text.replace("[east, west]", "[east, north]")
    with pytest.raises(InputError, match="unknown zone or region 'north'"):
        load_cluster(write(tmp_path, bad))


def test_an_empty_list_of_micro_batch_sizes_is_refused(tmp_path):
    """``micro_batch_sizes: []`` allowed no share at all and was accepted silently (its
    siblings ``schedules: []`` etc. were refused)."""
    p = tmp_path / "t.yaml"
    p.write_text("global_batch_size: 8\nseq_len: 128\nmicro_batch_sizes: []\n")
    with pytest.raises(InputError, match="micro_batch_sizes must list at least one size"):
        load_training(p)


def test_a_file_nested_thousands_deep_is_a_bad_file_not_a_crash(tmp_path, capsys):
    """The YAML composer recurses per level: 5,000 nested lists hit Python's recursion limit,
    which came out as an internal error (exit 3)."""
    p = tmp_path / "deep.yaml"
    p.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(["validate", str(p)]) == 2
    assert "nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize("extra, field, line", [
    ("num_attention_heads: 3\n", "num_attention_heads", 3),        # 3 does not divide 64
    ("num_attention_heads: 4\nnum_kv_heads: 3\n", "num_kv_heads", 4),
    ("num_attention_heads: 4\nrotary_base: 10000\n", "rotary_base", 4),
    ("num_attention_heads: 4\nnum_experts: 4\nmoe_top_k: 5\n", "moe_top_k", 5),
    ("num_attention_heads: 4\nmoe_top_k: 2\n", "moe_top_k", 4),
])
def test_model_cross_field_errors_name_the_field_and_its_line(tmp_path, extra, field, line):
    # Found by scripts/fuzz_plans.py's bad inputs: these checks span fields, and their errors
    # pointed at the mapping's line 1 with no field path.
    path = tmp_path / "m.yaml"
    path.write_text("num_layers: 4\nhidden_size: 64\n" + extra + "vocab_size: 100\n")
    with pytest.raises(InputError) as info:
        load_model(path)
    location = info.value.errors[0].location
    assert (location.field, location.line) == (field, line)


def test_training_cross_field_error_names_the_field(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("global_batch_size: 8\nseq_len: 100\ncontext_parallel_degrees: [1, 8]\n")
    with pytest.raises(InputError, match=r"t\.yaml:3:\d+: context_parallel_degrees: "):
        load_training(path)


@pytest.mark.parametrize("parse, text", [(parse_size_bytes, "1e300 GB"), (parse_bandwidth_Bps, "1e300 TB/s"),
                                         (parse_time_s, "1e307 h")])
def test_a_finite_number_that_overflows_in_base_units_is_refused(parse, text):
    # found by scripts/fuzz_plans.py: 'memory: 1e300 GB' became an infinite capacity, and the
    # search's piece sizes crashed with OverflowError (exit 3)
    with pytest.raises(UnitError, match="too large"):
        parse(text)


def test_an_overflowing_gpu_memory_names_its_field(tmp_path):
    text = GOOD.replace("gpu: A100-SXM4-80GB", "gpu: {name: big, memory: 1e300 GB, peak_tflops: 100, "
                        "memory_bandwidth: 1 TB/s, intra_node_bandwidth: 100 GB/s}")
    with pytest.raises(InputError, match=r"nodes\[0\]\.gpu\.memory: '1e300 GB' is too large"):
        load_cluster(write(tmp_path, text))


def test_a_single_value_where_a_list_belongs_says_so(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("global_batch_size: 8\nseq_len: 512\nschedules: 1f1b\n")
    with pytest.raises(InputError, match=r"t\.yaml:3:12: schedules: expected a list, e\.g\. \[1f1b, \.\.\.\]"):
        load_training(path)


def test_loader_set_cluster_fields_are_unknown_keys_in_a_spec(tmp_path):
    # found by scripts/fuzz_plans.py: `source_file:` in a spec was taken, then overwritten, and
    # the loader's own fields were offered among the valid keys
    text = "source_file: elsewhere.yaml\n" + GOOD.replace("name: t\n", "name: t\nnme: typo\n")
    with pytest.raises(InputError) as info:
        load_cluster(write(tmp_path, text))
    message = str(info.value)
    assert ":1:14: source_file: unknown key 'source_file'" in message
    assert "nme: unknown key 'nme'; valid keys: links, name, nodes, profiles, zones\n" in message + "\n"


@pytest.mark.parametrize("where, text", [
    ("nodes[0].price_per_hour", """
        name: absurd
        nodes:
          - {name: a, count: 1, gpu: A100-SXM4-80GB, gpus_per_node: 8, price_per_hour: 1e300}
        """),
    ("links[0].egress_price_per_gb", """
        name: absurd
        zones: [{name: x}, {name: y}]
        nodes:
          - {name: a, count: 1, zone: x, gpu: A100-SXM4-80GB, gpus_per_node: 8}
          - {name: b, count: 1, zone: y, gpu: A100-SXM4-80GB, gpus_per_node: 8}
        links:
          - {between: [x, y], bandwidth: 100 Gbit/s, egress_price_per_gb: 1e308}
        """),
])
def test_a_price_beyond_any_real_one_is_refused_naming_its_field(tmp_path, where, text):
    """Finite but absurd prices overflowed the objective's sums to inf and put Infinity / NaN
    in plan files (the robustness campaign): ten million dollars is the cap."""
    path = write(tmp_path, textwrap.dedent(text))
    with pytest.raises(InputError) as err:
        load_cluster(path)
    assert where in str(err.value) and "10000000" in str(err.value)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f", "\x9b"])
def test_a_control_character_is_bad_input_at_its_line_and_column(tmp_path, capsys, char):
    """PyYAML refuses these before parsing, with a ReaderError that carries a character
    offset only: it came out as an internal error (exit 3) instead of a located one."""
    path = write(tmp_path, GOOD.replace("gpus_per_node: 4", f"gpus_per_node: 4{char}"))
    with pytest.raises(InputError) as info:
        load_cluster(path)
    code = f"U+{ord(char):04X}"
    column = GOOD.splitlines()[6].index("gpus_per_node: 4") + len("gpus_per_node: 4") + 1
    assert str(info.value).startswith(f"{path}:7:{column}: control character {code} is not allowed in YAML")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert code in err and "internal error" not in err


def test_a_control_character_in_a_model_file_is_bad_input(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text("num_layers: 4\nhidden_size: 6\x074\nnum_attention_heads: 4\nvocab_size: 100\n")
    with pytest.raises(InputError, match=r"m\.yaml:2:15: control character U\+0007 is not allowed"):
        load_model(path)
    code = main(["plan", "cluster_specs/tiny-2gpu.yaml", "--model", str(path), "--global-batch-size", "8",
                 "--seq-len", "1024", "--time-limit", "5"])
    assert code == 2
    assert "U+0007" in capsys.readouterr().err


def test_a_control_character_after_crlf_lines_counts_columns_from_the_line_start(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"num_layers: 4\r\nhidden_size: 64\r\nname: a\x00b\r\n")
    with pytest.raises(InputError, match=r"m\.yaml:3:8: control character U\+0000 is not allowed in YAML "
                                         r"\(is this a binary file\?\)"):
        load_model(path)


@pytest.mark.parametrize("before", [
    "a: 1\u2028b: ",            # LINE SEPARATOR
    "a: 1\u2029\u2029b: ",      # PARAGRAPH SEPARATOR, twice
    "a: 1\x85c: 2\nb: ",        # NEXT LINE
    "a: 1\rb: ",                # a lone carriage return
    "a: 1\r\r\nb: ",            # a lone one, then CRLF: two breaks
    "a: 1\nb: '\ufeff' ",        # a byte order mark takes no column
    "a: 1\nb: '\ufeff\u2028' ",  # ... and a break inside a quoted string is one too
])
def test_a_control_character_is_located_as_pyyaml_locates_its_own_errors(before):
    """Found in review: only "\n" counted as a line break, so a control character after a
    U+2028 was put on line 1 where PyYAML's reader (and every mark it gives) sees line 2.  A
    character that cannot start a token ('@') at the same place gives PyYAML's own mark."""
    from planner.spec.source import load_yaml

    def where(text):
        with pytest.raises(InputError) as info:
            load_yaml("x.yaml", text)
        return info.value.location.line, info.value.location.column

    assert where(before + "\x07\n") == where(before + "@\n")


def test_a_control_character_after_a_line_separator_is_on_the_next_line():
    from planner.spec.source import load_yaml

    with pytest.raises(InputError, match=r"^x\.yaml:2:4: control character U\+0007 is not allowed"):
        load_yaml("x.yaml", "a: 1\u2028b: \x07\n")


@pytest.mark.parametrize("text", [
    "d: &d {1: a, true: b}\nf: {<<: *d}\n",
    "d: &d {1: a, true: b}\nf: {<<: [*d]}\ng:\n  <<: *d\nh: *d\n",
    "d: &d {x: 1, x: 2}\nf: {<<: *d, y: 3}\n",
])
def test_an_error_in_an_anchored_mapping_is_reported_once(text):
    """Found in review: with merge keys (or aliases) an error inside the anchored mapping came
    once at the anchor and again for each mapping that merged it, all at the same line."""
    from planner.spec.source import load_yaml

    with pytest.raises(InputError) as info:
        load_yaml("x.yaml", text)
    errors = getattr(info.value, "errors", [info.value])
    assert len(errors) == 1 and errors[0].location.line == 1
    assert errors[0].location.field in ("d", "d.x")


MERGED = """\
name: merged
nodes:
  - &dgx
    name: rack1
    count: 2
    gpu: A100-SXM4-80GB
    gpus_per_node: 8
    network_bandwidth: 800 Gbit/s
  - <<: *dgx
    name: rack2
"""


def test_merge_keys_fill_in_the_fields_a_mapping_lacks(tmp_path):
    cluster = load_cluster(write(tmp_path, MERGED))
    assert [n.name for n in cluster.node_list] == ["rack1-0", "rack1-1", "rack2-0", "rack2-1"]
    assert cluster.node_by_name["rack2-1"].gpu.name == "A100-SXM4-80GB"
    # the flow style of a robustness sweep's file: the anchored mapping is itself a node group
    flow = ("name: merge-keys2\nnodes:\n  - &dgx {name: rack1, count: 2, gpu: A100-SXM4-80GB, "
            "gpus_per_node: 8, network_bandwidth: 800 Gbit/s}\n  - <<: *dgx\n    name: rack2\n")
    assert load_cluster(write(tmp_path, flow)).num_gpus == 32


def test_an_explicit_key_overrides_the_merged_one_wherever_it_stands(tmp_path):
    # explicit keys win over merged ones whether written before or after the <<
    text = MERGED.replace("  - <<: *dgx\n    name: rack2\n",
                          "  - count: 1\n    <<: *dgx\n    name: rack2\n    gpus_per_node: 4\n")
    cluster = load_cluster(write(tmp_path, text))
    assert [n.name for n in cluster.node_list] == ["rack1-0", "rack1-1", "rack2-0"]
    assert cluster.node_by_name["rack2-0"].group.gpus_per_node == 4
    assert cluster.num_gpus == 2 * 8 + 4


def test_a_list_of_merged_mappings_gives_the_first_listed_precedence(tmp_path):
    text = MERGED.replace("  - <<: *dgx\n", "  - <<: [{count: 3, gpus_per_node: 4}, *dgx]\n")
    group = load_cluster(write(tmp_path, text)).node_by_name["rack2-2"].group
    assert (group.count, group.gpus_per_node, group.gpu.name) == (3, 4, "A100-SXM4-80GB")


def test_a_merged_field_is_located_at_the_line_that_wrote_it(tmp_path):
    # count: 0 is wrong in the anchor and so in every mapping that merges it; an explicit
    # field of the merging mapping keeps its own line
    text = MERGED.replace("count: 2", "count: 0") + "    gpu: B300\n"
    with pytest.raises(InputError) as info:
        load_cluster(write(tmp_path, text))
    where = {(e.location.field, e.location.line) for e in info.value.errors}
    assert where == {("nodes[0].count", 5), ("nodes[1].count", 5), ("nodes[1].gpu", 11)}


@pytest.mark.parametrize("merge, where, needle", [
    ("<<: 5", "7:19", "a merge key (<<) takes a mapping"),
    ("<<: [*a, 5]", "7:24", "a merge key (<<) takes a mapping"),
    ("<<: *a, <<: *a", "7:23", "duplicate key '<<'"),
])
def test_a_bad_merge_key_is_one_located_error(tmp_path, merge, where, needle):
    path = write(tmp_path, GOOD.replace("name: t\n", "name: t\nx: &a {count: 1}\n").replace(
        "count: 2, zone: a", merge + ", zone: a"))
    with pytest.raises(InputError) as info:
        load_cluster(path)
    message = str(info.value)
    assert f"{path}:{where}" in message and needle in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("typed, meant", [("H100", ["H100-SXM5-80GB", "H100-PCIE-80GB"]),
                                          ("A100-SXM-80G", ["A100-SXM4-80GB"]), ("Zorro", [])])
def test_an_unknown_gpu_type_names_the_ids_it_likely_meant(typed, meant):
    """A short or mistyped GPU name listed all 19 ids and no nearest one."""
    from planner import catalog
    assert catalog.nearest_gpus(typed) == meant
    with pytest.raises(InputError) as err:
        catalog.gpu(typed)
    assert (f"(did you mean {' or '.join(meant)}?)" in str(err.value)) == bool(meant)
