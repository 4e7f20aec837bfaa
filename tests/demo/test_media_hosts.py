"""What the demo's workers may fetch image URLs from: its own media origin (port_base + 7),
plus the hosts `--media-host` adds; the ready line publishes the origin for mmlens."""

from __future__ import annotations

import pytest
from mmlens.demo.cli import config_from, parse_args
from mmlens.demo.cluster import Cluster, ClusterConfig, ports_needed
from mmlens.demo.dynamo_cli import config_from as dynamo_config_from
from mmlens.demo.dynamo_cli import parse_args as dynamo_parse_args
from mmlens.demo.dynamo_cluster import DynamoCluster
from mmlens.demo.dynamo_cluster import ports_needed as dynamo_ports_needed
from mmlens.demo.media_origin import media_host


def allowed_flag(cmd: list[str]) -> str:
    return cmd[cmd.index("--allowed-media-hosts") + 1]


def test_smg_demo_workers_fetch_only_from_the_demo_origin_by_default() -> None:
    cluster = Cluster(config_from(parse_args(["--port-base", "20000"])))
    assert allowed_flag(cluster._worker_cmd(0)) == "127.0.0.7:20007"
    smg = cluster._smg_cmd(cluster.routers[0])
    # SMG's own list holds hosts only (it refuses "host:port" entries: nothing matches): the
    # origin's own address, not 127.0.0.1 where the routers' and workers' ports are.
    assert smg[smg.index("--mm-allowed-media-domains") + 1] == "127.0.0.7"
    info = cluster.ready_info()
    assert info["media_origin"] == "http://127.0.0.7:20007"
    assert info["media_hosts"] == ["127.0.0.7:20007"]
    assert 20007 in ports_needed(cluster.cfg)
    cluster.stop()  # removes its log folder


def test_media_host_adds_hosts_on_both_demos() -> None:
    args = ["--port-base", "20000", "--media-host", "127.0.0.1:9000", "--media-host",
            "Images.Example:443"]
    smg = Cluster(config_from(parse_args(args)))
    assert allowed_flag(smg._worker_cmd(1)) == "127.0.0.7:20007,127.0.0.1:9000,images.example:443"
    dyn = DynamoCluster(dynamo_config_from(dynamo_parse_args(args)))
    try:
        assert allowed_flag(dyn._worker_cmd(0)) == allowed_flag(smg._worker_cmd(0))
        assert dyn.ready_info()["media_origin"] == "http://127.0.0.7:20007"
        assert 20007 in dynamo_ports_needed(dyn.cfg)
    finally:
        dyn.stop()  # removes its scratch and log folders
    smg.stop()


@pytest.mark.parametrize("bad", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "a,b:1",
                                 "http://h:1", ":80", "h:1/x"])
def test_bad_media_hosts_are_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="media host"):
        media_host(bad)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--media-host", bad])
    assert exc.value.code == 2 and "argument --media-host: media host" in capsys.readouterr().err
    with pytest.raises(ValueError, match="media host"):
        Cluster(ClusterConfig(media_hosts=[bad]))


def test_host_port_forms() -> None:
    assert media_host("[::1]:8080") == "::1:8080"
    assert media_host("127.0.0.1:*") == "127.0.0.1:*"
