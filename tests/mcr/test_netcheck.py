"""Interface variables are checked against this node's interfaces before any backend starts."""

import pytest

from mcr.netcheck import NetworkConfigError, check_names, interfaces


def test_a_missing_interface_is_named_with_the_variable_and_what_the_node_has():
    with pytest.raises(
        NetworkConfigError,
        match=r"OMPI_MCA_btl_tcp_if_include=lo,nope0: \S+ has no interface 'nope0' \(it has lo 127.0.0.1",
    ):
        check_names({"OMPI_MCA_btl_tcp_if_include": "lo,nope0"}, spans_nodes=False)


def test_loopback_alone_is_refused_only_for_a_job_that_spans_nodes_and_subnets_select_interfaces():
    check_names({"GLOO_SOCKET_IFNAME": "lo"}, spans_nodes=False)  # one node: loopback carries it all
    with pytest.raises(NetworkConfigError, match="GLOO_SOCKET_IFNAME=lo: on .* loopback only"):
        check_names({"GLOO_SOCKET_IFNAME": "lo"}, spans_nodes=True)
    with pytest.raises(NetworkConfigError, match="loopback only"):  # Open MPI's subnet form
        check_names({"OMPI_MCA_btl_tcp_if_include": "127.0.0.0/8"}, spans_nodes=True)
    assert interfaces()["lo"] == "127.0.0.1"
