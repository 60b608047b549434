"""Hints at the input (issue #18): what a user wrote is quoted back as written, GPU names as
nvidia-smi prints them, lists, ssh addresses, tabs, node sets (ClusterShell), and the ssh options a
spec may set (issue #15 M1). The error texts themselves are golden cases in tests/cases/invalid/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler import loader, validate
from compiler.errors import SpecError

HOSTS = """hosts:
  src: {ssh: root@src.example}
  dst: {ssh: root@dst.example}
transfer:
  from: src:/opt/venv
  to: dst:/opt/venv
"""


def problems(tmp_path: Path, text: str, files: dict[str, str] | None = None) -> list[str]:
    for name, body in (files or {}).items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    spec = tmp_path / "s.yaml"
    spec.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as exc:
        validate.validate(loader.load(str(spec)))
    return exc.value.lines()


# -- numbers where strings belong: quoted as written ----------------------------------------------


@pytest.mark.parametrize(
    "written, read", [("12.10", "12.1"), ("13.0", "13.0"), ("12", "12"), ("2.10", "2.1")]
)
def test_a_number_is_quoted_back_as_it_was_written(tmp_path, written, read):
    lines = problems(tmp_path, f"name: v\n{HOSTS}cuda:\n  version: {written}\n  home: /usr/cuda\n")
    assert len(lines) == 1
    assert f'write it in quotes, e.g. "{written}"' in lines[0]
    if written != read:
        assert f"(YAML reads {written} as the number {read})" in lines[0]


def test_a_number_in_a_base_is_quoted_from_the_base(tmp_path):
    base = f"abstract: true\n{HOSTS}cuda: {{version: 12.10, home: /usr/cuda}}\n"
    lines = problems(tmp_path, "extends: base.yaml\nname: child\n", {"base.yaml": base})
    assert lines[0].startswith(f"{tmp_path}/base.yaml:8:17: cuda.version:")
    assert '"12.10"' in lines[0]


# -- a string where a list belongs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "entry, hint",
    [  # HOSTS ends inside transfer:
        (
            '  exclude: "__pycache__"',
            'transfer.exclude: must be a list: write exclude: ["__pycache__"]',
        ),
        ("  exclude: __pycache__, .git", 'write exclude: ["__pycache__", ".git"]'),
        (
            "checks:\n  - imports: torch",
            'checks[0].imports: must be a list: write imports: ["torch"]',
        ),
        (
            "cuda: {version: '13.0', home: /usr/cuda, library_path_first: nvidia/cu13/lib}",
            'write library_path_first: ["nvidia/cu13/lib"]',
        ),
    ],
)
def test_a_string_where_a_list_belongs_shows_the_list_form(tmp_path, entry, hint):
    lines = problems(tmp_path, f"name: l\n{HOSTS}{entry}\n")
    assert len(lines) == 1 and hint in lines[0], lines


# -- ssh addresses, tabs, fanout.success ---------------------------------------------------------


@pytest.mark.parametrize(
    "written, target, port",
    [
        ("ssh://ubuntu@gpu-07.example:2222", "ubuntu@gpu-07.example", 2222),
        ("ssh://gpu-07.example", "gpu-07.example", None),
        ("ssh://root@gpu-07.example:22/", "root@gpu-07.example", 22),
        ("ssh://root@[fd00::7]:2200", "root@fd00::7", 2200),
    ],
)
def test_an_ssh_uri_is_read_as_user_host_and_port(written, target, port):
    from compiler.spec import Host

    host = Host.model_validate({"ssh": written})
    assert (host.ssh, host.port) == (target, port)
    assert Host.model_validate({"ssh": written, "port": port}).port == port


@pytest.mark.parametrize(
    "written, message",
    [
        ("root@gpu-07.example:2222", "use `port: 2222` (and `ssh: root@gpu-07.example`)"),
        ("[fd00::7]:22", "use `port: 22` (and `ssh: fd00::7`)"),
        ("ssh://root@gpu-07.example/opt", "is not an ssh address like ssh://user@host:2222"),
        ("ssh://root@gpu-07.example:0", "'0' is not a port number"),
    ],
)
def test_an_ssh_address_with_a_port_or_path_is_refused_with_a_hint(tmp_path, written, message):
    text = f"name: s\n{HOSTS}".replace("root@dst.example", f'"{written}"')
    lines = problems(tmp_path, text)
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path}/s.yaml:4:14: hosts.dst.ssh: ")
    assert message in lines[0]


def test_an_ssh_uri_jump_hop_is_written_as_ssh_j_takes_it():
    from compiler.spec import Host

    host = Host.model_validate(
        {"ssh": "h", "jump": "ssh://a@gw:2200,b@[fd00::1]:22,ssh://c@[fd00::2]:23"}
    )
    assert host.jump == "a@gw:2200,b@[fd00::1]:22,c@[fd00::2]:23"


@pytest.mark.parametrize(
    "text, where",
    [
        ("name: t\nhosts:\n\tsrc: {local: true}\n", "3:1"),
        ("name:\tt\n", "1:6"),
        ("name: t\nhosts:\n  src:\t{local: true}\n", "3:7"),
    ],
)
def test_a_tab_is_named_at_its_position(tmp_path, text, where):
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as exc:
        loader.load(str(tmp_path / "s.yaml"))
    assert exc.value.lines() == [
        f"{tmp_path}/s.yaml:{where}: YAML needs spaces, not tabs: replace the tab here with spaces"
    ]


FANOUT = """name: f
hosts:
  here: {local: true}
transfer:
  from: here:/opt/build/venv
  to: here:/opt/venv
fanout:
  nodes: node[1-4]
  success: %s
"""


@pytest.mark.parametrize(
    "value, message",
    [
        ("5", "fanout.success: 5 is more nodes than node[1-4] has (4)"),
        (
            "most",
            "fanout.success: must be \"all\" or how many nodes must pass (1 to 4096); got 'most'",
        ),
        ("0", "got 0"),
        ('"3"', "got '3' (a number: write it without quotes)"),
    ],
)
def test_fanout_success_errors_point_at_success(tmp_path, value, message):
    lines = problems(tmp_path, FANOUT % value)
    assert (
        lines == [f"{tmp_path}/s.yaml:9:12: {message}"]
        if message.startswith("fanout")
        else len(lines) == 1
        and lines[0].startswith(f"{tmp_path}/s.yaml:9:12: fanout.success:")
        and message in lines[0]
    )


# -- GPU names as people write them or nvidia-smi prints them --------------------------------------


@pytest.mark.parametrize(
    "written, model",
    [
        ("H100 SXM", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("rtx pro 6000 blackwell", "RTX-PRO-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX-PRO-6000"),
        ("b300", "B300"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("hgx_b300", "B300"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla V100S-PCIE-32GB", "V100"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GB200", "GB200"),
        ("GB300 NVL72", "GB300"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_gpu_names_as_written_or_printed_match_the_catalog(written, model):
    from compiler import catalog

    assert catalog.lookup(written).name == model


@pytest.mark.parametrize(
    "written, near",
    [
        ("H110", ["H100"]),
        ("b30", ["B300", "GB300"]),
        ("NVIDIA H800", ["H200", "H100", "GH200"]),
        ("RTX 6000", ["RTX-PRO-6000"]),
    ],
)
def test_an_unknown_gpu_name_gets_the_closest_catalog_names(written, near):
    from compiler import catalog

    assert catalog.lookup(written) is None
    assert catalog.closest(written) == near


def test_only_noise_is_not_a_model():
    from compiler import catalog

    assert catalog.lookup("NVIDIA") is None and catalog.lookup("80GB HBM3") is None


def test_a_printed_gpu_name_compiles_with_the_catalog_capability(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: s\n{HOSTS}gpu: {{model: NVIDIA H100 80GB HBM3}}\n"
        "cuda: {version: '12.4', home: /usr/cuda}\n"
    )
    from compiler import resolve

    source = loader.load(str(spec))
    config = json.loads(resolve.resolve(validate.validate(source), source, "s.sh").checks.config)
    assert config["gpu"] == {
        "model": "NVIDIA H100 80GB HBM3",
        "count": 1,
        "capability": "9.0",
        "arch": "sm_90",
        "names": ["H100", "H100-SXM", "H100-SXM5", "H100-PCIE", "H100-NVL"],
    }


# -- node sets: ClusterShell's NodeSet -------------------------------------------------------------


def groups(**named: str):
    from ClusterShell.NodeUtils import GroupResolver, GroupSource

    return GroupResolver(GroupSource("test", named))


@pytest.mark.parametrize(
    "text, nodes",
    [
        ("gpu[01-16/2]", ["gpu01", "gpu03", "gpu05", "gpu07", "gpu09", "gpu11", "gpu13", "gpu15"]),
        (
            "gpu[01-04,07],login[1-2]",
            ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1", "login2"],
        ),
        ("a[1-2]b[1-2]", ["a1b1", "a1b2", "a2b1", "a2b2"]),
        ("gpu[01-08]!gpu[03-07]", ["gpu01", "gpu02", "gpu08"]),
        ("n[1-3]&n[2-5]", ["n2", "n3"]),
        ("n[1-3],n2", ["n1", "n2", "n3"]),  # as clush: a node named twice is one node
        ("node7", ["node7"]),
    ],
)
def test_node_sets_expand_as_clustershell_reads_them(text, nodes):
    from compiler import fanout

    assert fanout.expand(text) == nodes


def test_groups_resolve_with_the_resolver_and_fold_for_the_engines():
    from compiler import fanout

    res = groups(gpus="gpu[01-04]", login="login[1-2]")
    assert fanout.expand("@gpus,@login!gpu02", res) == [
        "gpu01",
        "gpu03",
        "gpu04",
        "login1",
        "login2",
    ]
    assert fanout.folded("@test:gpus", res) == "gpu[01-04]"
    assert fanout.folded("gpu[01-16/4]") == "gpu[01,05,09,13]"


@pytest.mark.parametrize(
    "text, message",
    [
        ("@gpus", "ClusterShell group @gpus cannot be resolved at compile time"),
        ("@nosuch:gpus", "ClusterShell group @nosuch:gpus cannot be resolved at compile time"),
        ("node[08-01", 'not a node set (ClusterShell: missing bracket: "node[08-01")'),
        (
            "node[08-01]",
            'not a node set (ClusterShell: bad range: "invalid values in range : "08-01"")',
        ),
        ("n[1-3]]", 'not a node set (ClusterShell: illegal closing bracket: "]")'),
        (",a", "not a node set (ClusterShell: missing nodeset operand with ',' operator"),
        ("node[1-999999999]", "more than 4096 nodes"),
        ("a[1-100]b[1-100]", "more than 4096 nodes"),
        ("n[1-9000/2]", "more than 4096 nodes"),
        ("-rf", "'-rf' is not a node name"),
        ("$(reboot)", "'$(reboot)' is not a node name"),
        ("a!a", "'a!a' names no nodes"),
        ("a b", "no spaces"),
    ],
)
def test_bad_node_sets_say_why(text, message):
    from compiler import fanout

    with pytest.raises(ValueError) as exc:
        fanout.expand(text, groups(login="login[1-2]"))
    assert message in str(exc.value)


def test_without_any_group_configuration_a_group_gets_the_same_message(tmp_path):
    from ClusterShell.NodeUtils import GroupResolverConfig

    from compiler import fanout

    with pytest.raises(ValueError) as exc:  # no groups.conf: what the golden case says there too
        fanout.expand("@gpus", GroupResolverConfig([str(tmp_path / "groups.conf")]))
    assert str(exc.value).startswith(
        "ClusterShell group @gpus cannot be resolved at compile time: "
    )


def test_a_node_set_with_a_group_compiles_to_the_groups_nodes(tmp_path, monkeypatch):
    from compiler import cli, fanout

    monkeypatch.setattr(fanout, "std_group_resolver", lambda: groups(gpus="gpu[01-04]"))
    spec = tmp_path / "g.yaml"
    spec.write_text(
        "name: g\nhosts:\n  here: {local: true}\ntransfer:\n  from: here:/opt/b\n"
        "  to: here:/opt/v\nfanout:\n  engine: slurm\n  nodes: '@gpus,gpu[10-16/3]'\n"
    )
    assert cli.main([str(spec), "-o", str(tmp_path)]) == 0
    text = (tmp_path / "g.sh").read_text()
    assert (
        "# 7 nodes (fanout.nodes: @gpus,gpu[10-16/3])\nreadonly RB_FAN_NODES='gpu[01-04,10,13,16]'"
        in text
    )
    assert "RB_FAN_NODE_LIST=(gpu01 gpu02 gpu03 gpu04 gpu10 gpu13 gpu16)" in text
    assert "srun -N 7 -n 7 --ntasks-per-node=1 -w gpu[01-04,10,13,16] " in text


# -- --plan of a fan-out spec ----------------------------------------------------------------------


def test_the_plan_of_a_fanout_spec_heads_its_checks_on_every_node(capsys):
    from compiler import cli

    root = Path(__file__).resolve().parents[2]
    assert cli.main(["--plan", str(root / "specs/cluster8.yaml")]) == 0
    text = capsys.readouterr().out
    assert "### Checks on every node (8), with the moved interpreter" in text
    assert "### Checks on `login`" not in text


def test_a_torch_warning_of_a_fanout_spec_names_every_node(tmp_path):
    spec = tmp_path / "w.yaml"
    spec.write_text(
        "name: w\nhosts:\n  here: {local: true}\ntransfer:\n  from: here:/opt/b\n"
        "  to: here:/opt/v\nfanout: {nodes: 'gpu[1-2]'}\ngpu: {model: B300}\n"
        "checks:\n  - torch: {cuda: '12.4'}\n"
    )
    _spec, warnings = validate.validate_with_warnings(loader.load(str(spec)))
    assert [w.message.rsplit("; ", 1)[1] for w in warnings] == [
        "expect the checks to fail on every node"
    ]


# -- ssh options: an allowlist (issue #15 M1) ----------------------------------------------------

# Code or commands on this machine, host keys off, this machine's agent, display, credentials or
# ports handed over, config directives, options the runbook sets itself. Each compiled before the
# allowlist, except ProxyCommand, LocalCommand, PermitLocalCommand, KnownHostsCommand and
# StrictHostKeyChecking, which the old denylist refused already (with other words).
DANGEROUS = [
    ("PKCS11Provider", "/tmp/evil.so", "loads a library into ssh on this machine"),
    ("SecurityKeyProvider", "/tmp/evil.so", "loads a library into ssh on this machine"),
    ("XAuthLocation", "/tmp/evil", "names a program ssh runs on this machine"),
    ("UserKnownHostsFile", "/dev/null", "turns host key checking off"),
    ("UserKnownHostsFile", "none", "turns host key checking off"),
    ("ForwardAgent", "yes", "hands this machine's ssh agent to the remote host"),
    ("LocalForward", "8080 127.0.0.1:80", "opens a tunnel"),
    ("RemoteForward", "8080 127.0.0.1:80", "opens a tunnel"),
    ("DynamicForward", "1080", "opens a tunnel"),
    ("ProxyCommand", "nc %h %p", "a ProxyCommand runs a command on this machine"),
    ("LocalCommand", "touch /tmp/x", "runs a command on this machine"),
    ("PermitLocalCommand", "yes", "lets LocalCommand run"),
    ("KnownHostsCommand", "/bin/echo", "runs a command on this machine"),
    ("Include", "/tmp/other_config", "a config file directive"),
    ("Match", "exec true", "`Match exec` runs a command on this machine"),
    ("ForwardX11", "yes", "opens this machine's X display"),
    ("SendEnv", "AWS_SECRET_ACCESS_KEY", "sends this machine's environment variables"),
    ("GSSAPIDelegateCredentials", "yes", "hands your Kerberos credentials"),
    ("ConnectTimeout", "30", "use `connect_timeout:`"),
    ("Ciphers", "aes256-ctr", "the runbook chooses the ciphers"),
    ("stricthostkeychecking", "no", "checking is never turned off"),
]


def host_with(options: str) -> str:
    return f"name: o\n{HOSTS}".replace(
        "{ssh: root@dst.example}", f"{{ssh: root@dst.example, options: {{{options}}}}}"
    )


@pytest.mark.parametrize("key, value, why", DANGEROUS, ids=[f"{k}={v}" for k, v, _ in DANGEROUS])
def test_a_dangerous_ssh_option_is_refused_at_its_position(tmp_path, key, value, why):
    lines = problems(tmp_path, host_with(f'{key}: "{value}"'))
    assert len(lines) == 1, lines
    column = 42 + len(f"{key}: ") if key == "UserKnownHostsFile" else 42  # its value; else its key
    assert lines[0].startswith(f"{tmp_path}/s.yaml:4:{column}: hosts.dst.options.{key}: "), lines[0]
    assert why in lines[0]
    if key != "UserKnownHostsFile":
        assert "(allowed: AddressFamily, BindAddress, " in lines[0]


@pytest.mark.parametrize(
    "key, hint",
    [
        ("ServerAliveIntervall", "'ServerAliveInterval'"),
        ("Compresion", "'Compression'"),
        ("TCPKeepalive", None),
        ("VisualHostKey", ""),
    ],
)
def test_an_unknown_ssh_option_gets_a_did_you_mean_and_the_allowed_list(tmp_path, key, hint):
    text = host_with(f'{key}: "yes"')
    if hint is None:  # ssh reads option names without case
        spec = tmp_path / "s.yaml"
        spec.write_text(text)
        validate.validate(loader.load(str(spec)))
        return
    lines = problems(tmp_path, text)
    assert len(lines) == 1 and "is not among the ssh options a spec may set" in lines[0]
    assert (f"did you mean {hint}?" in lines[0]) if hint else "did you mean" not in lines[0]
    assert "ServerAliveCountMax, ServerAliveInterval, TCPKeepAlive, UserKnownHostsFile)" in lines[0]


@pytest.mark.parametrize(
    "options",
    [
        'ServerAliveInterval: "30", ServerAliveCountMax: "4", Compression: "no", IPQoS: throughput',
        "UserKnownHostsFile: /etc/rb/known_hosts, GlobalKnownHostsFile: /dev/null",
        'UserKnownHostsFile: "~/.ssh/known_hosts /etc/rb/known_hosts"',
        'KexAlgorithms: "+diffie-hellman-group14-sha256", HostKeyAlgorithms: ssh-ed25519',
        'AddressFamily: inet6, LogLevel: ERROR, IdentitiesOnly: "yes", TCPKeepAlive: "no"',
        'MACs: "hmac-sha2-256-etm@openssh.com,umac-128-etm@openssh.com", RekeyLimit: 1G 1h',
    ],
)
def test_the_options_a_relay_needs_are_allowed(tmp_path, options):
    spec = tmp_path / "s.yaml"
    spec.write_text(host_with(options))
    validate.validate(loader.load(str(spec)))


def test_known_hosts_files_are_compared_and_passed_on_as_the_kernel_reads_them(tmp_path):
    """Issue 33 N5: the allowlist compared strings, so `/dev/./null` and `//dev/null` passed as
    UserKnownHostsFile (host key checking off) and a file in /dev or /proc was taken. They are
    normalised now: refused where they land, and what ssh gets is the normal name."""
    for value, why in (
        ("/dev/./null", "/dev/./null is /dev/null: it turns host key checking off"),
        ("//dev/null", "//dev/null is /dev/null: it turns host key checking off"),
        ("/etc/rb/known_hosts /dev//null", "/dev//null is /dev/null"),
        ("/dev/tty", "/dev/tty is in /dev, a device, not a known_hosts file"),
        ("/sys/kernel/notes", "is in /sys"),
        ("//proc/self/fd/0", "is in /proc"),
        ("%d/.ssh/known_hosts", "ssh's % tokens are not taken here"),
        ("known_hosts", "ssh would read it from wherever the runbook runs"),
    ):
        lines = problems(tmp_path, host_with(f'UserKnownHostsFile: "{value}"'))
        assert len(lines) == 1 and why in lines[0], (value, lines)
    lines = problems(tmp_path, host_with("GlobalKnownHostsFile: /proc/self/fd/0"))
    assert len(lines) == 1 and "/proc/self/fd/0 is in /proc" in lines[0], lines
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: o\n"
        + HOSTS.replace(
            "{ssh: root@dst.example}",
            (
                "{ssh: root@dst.example, options: {GlobalKnownHostsFile: //dev/./null, "
                'UserKnownHostsFile: "/etc//rb/./known_hosts ~/.ssh//known_hosts"}}'
            ),
        )
    )
    options = validate.validate(loader.load(str(spec))).hosts["dst"].options
    assert options == {
        "GlobalKnownHostsFile": "/dev/null",
        "UserKnownHostsFile": "/etc/rb/known_hosts ~/.ssh/known_hosts",
    }


def test_every_bad_option_is_reported_at_once(tmp_path):
    lines = problems(
        tmp_path, host_with('ForwardAgent: "yes", Compression: maybe, ConnectionAttempts: many')
    )
    assert [line.split(": ", 2)[1] for line in lines] == [
        "hosts.dst.options.ForwardAgent",
        "hosts.dst.options.Compression",
        "hosts.dst.options.ConnectionAttempts",
    ]
    assert lines[1].endswith("hosts.dst.options.Compression: must be one of yes, no")


def test_the_readme_lists_every_allowed_ssh_option():
    from compiler import sshopts

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert [name for name in sshopts.ALLOWED if name not in readme] == []


# -- ssh_config: (issue 36) -----------------------------------------------------------------------


def host_config(value: str, extra: str = "") -> str:
    return f"name: o\n{HOSTS}{extra}".replace(
        "{ssh: root@dst.example}", f"{{ssh: team-dst, ssh_config: {value}}}"
    )


TAKEN_FROM = "a relative path is taken from the folder of the spec file that writes it"


@pytest.mark.parametrize(
    "value, why",
    [
        ("/etc/rb/../ssh_config", "without `..` (write the folder it means)"),
        ("~/.ssh/../x", "without `..`"),
        (
            "ssh/../config",
            "`..` only at the start of a relative path, where it climbs out of the spec's folder",
        ),
        ("../../ssh/./../config", "`..` only at the start"),
        ("./", "must be a path to a file: absolute, ~/ or relative"),
        ("../..", "must be a path to a file"),
        ("'ssh config'", "must be a path to a file"),
        ("/dev/stdin", "/dev/stdin is in /dev, a device, not an ssh config file"),
        ("//proc/self/fd/0", "is in /proc"),
        ('"~/.ssh/%h.conf"', "ssh's % tokens are not taken here"),
        ('"-oProxyCommand=x"', "must be a path to a file"),
        ('"~root/.ssh/config"', "must be a path to a file"),
        ("/".join([".."] * 40) + "/etc/ssh_config", "climbs above / from /"),
        ("/".join([".."] * 40) + "/../dev/stdin", "climbs above / from /"),
    ],
)
def test_an_ssh_config_path_is_refused_where_it_could_not_be_a_file_of_this_machine(
    tmp_path, value, why
):
    lines = problems(tmp_path, host_config(value))
    assert len(lines) == 1 and "hosts.dst.ssh_config: " in lines[0] and why in lines[0], lines
    if "/dev/" not in why and "/proc" not in why and "%" not in why:
        assert TAKEN_FROM in lines[0], lines  # what a relative path would have meant, said


def test_a_relative_ssh_config_that_lands_in_dev_is_refused_as_the_path_it_names(tmp_path):
    up = "/".join([".."] * len(tmp_path.resolve().parts[1:]))
    lines = problems(tmp_path, host_config(f"{up}/dev/stdin"))
    assert (
        len(lines) == 1
        and f"is /dev/stdin from {tmp_path.resolve()}: /dev/stdin is in /dev, a device" in lines[0]
    ), lines


def test_a_relative_ssh_config_in_a_folder_with_a_space_is_taken(tmp_path):
    """Only the value's own characters are checked: the spec's folder may hold any."""
    folder = tmp_path / "My Project" / "specs"
    folder.mkdir(parents=True)
    spec = folder / "x.yaml"
    spec.write_text(host_config("ssh/config").replace("name: o", "name: x"))
    assert ' -F "${RB_SELF_ABS%/*}"/../specs/ssh/config ' in compiled_hosts(
        spec, folder.parent / "generated"
    )


def compiled_hosts(spec: Path, out: Path) -> str:
    """The RB_HOST_SSH lines of `spec` compiled into `out`."""
    from compiler import cli

    assert cli.main([str(spec), "-o", str(out)]) == 0
    text = (out / f"{spec.stem}.sh").read_text()
    return "\n".join(
        line.replace(")", " )") for line in text.splitlines() if "RB_HOST_SSH=(" in line
    )


@pytest.mark.parametrize(
    "value, seen",
    [
        ("ssh/config", "../specs/ssh/config"),
        ("./ssh//config", "../specs/ssh/config"),
        ("../ssh/config", "../ssh/config"),  # beside specs/: the project's ssh/config
        ("team@b300,v=2:+a", "'../specs/team@b300,v=2:+a'"),  # a comma quoted (SC2054)
    ],
)
def test_a_relative_ssh_config_is_taken_from_the_specs_folder_and_found_from_the_runbooks(
    tmp_path, monkeypatch, value, seen
):
    """Issue 36: `ssh_config: ssh/config` in specs/x.yaml is specs/ssh/config, and the runbook in
    generated/ finds it from its own folder (RB_SELF_ABS) wherever it runs from: the committed
    runbook holds no absolute path of the checkout."""
    proj = tmp_path / "proj"
    (proj / "specs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # compile runs from anywhere: the way is the runbook's
    spec = proj / "specs" / "x.yaml"
    spec.write_text(host_config(json.dumps(value)).replace("name: o", "name: x"))
    lines = compiled_hosts(spec, proj / "generated")
    assert f' -F "${{RB_SELF_ABS%/*}}"/{seen} ' in lines, lines
    assert str(tmp_path) not in lines


def test_a_relative_ssh_config_of_a_base_spec_is_taken_from_the_bases_folder(tmp_path):
    proj = tmp_path / "proj"
    for d in ("specs", "bases/team"):
        (proj / d).mkdir(parents=True)
    (proj / "bases" / "team" / "hosts.yaml").write_text(
        "abstract: true\n"
        + HOSTS.split("transfer:")[0].replace(
            "{ssh: root@dst.example}", "{ssh: team-dst, ssh_config: ../ssh/config}"
        )
    )
    spec = proj / "specs" / "x.yaml"
    spec.write_text(
        "name: x\nextends: ../bases/team/hosts.yaml\ntransfer:\n  from: src:/opt/v\n"
        "  to: dst:/opt/v\n"
    )
    lines = compiled_hosts(spec, proj / "generated")
    assert ' -F "${RB_SELF_ABS%/*}"/../bases/ssh/config ' in lines, lines


@pytest.mark.parametrize(
    "value, seen",
    [
        ("/etc/rb//ssh_config", "/etc/rb/ssh_config"),
        ("/etc/rb/a,b", "'/etc/rb/a,b'"),
        ("~/.ssh/a,b", "\"${HOME}\"/'.ssh/a,b'"),  # compiled to a lint failure before
    ],
)
def test_an_absolute_or_home_ssh_config_stays_as_written(tmp_path, value, seen):
    spec = tmp_path / "x.yaml"
    spec.write_text(host_config(json.dumps(value)).replace("name: o", "name: x"))
    assert f" -F {seen} " in compiled_hosts(spec, tmp_path / "generated")


def test_an_ssh_config_goes_to_every_ssh_of_its_host_as_dash_f(tmp_path):
    from compiler import resolve

    spec = tmp_path / "s.yaml"
    spec.write_text(host_config('"~/.ssh//team.conf"'))
    host = validate.validate(loader.load(str(spec))).hosts["dst"]
    assert host.ssh_config == "~/.ssh/team.conf"
    words = resolve.ssh_words(host)
    assert words[words.index("-F") + 1] == '"${HOME}"/.ssh/team.conf'


@pytest.mark.parametrize(
    "extra, where, why",
    [
        (
            "  route: direct\n",
            "transfer.route: direct: src reaches dst with its own ssh, which does not "
            "read hosts.dst.ssh_config",
            "",
        ),
        (
            "  route: auto\n  direct: {ssh: root@dst.example, ssh_config: /etc/rb/ssh_config}\n",
            "transfer.direct.ssh_config: the direct hop is the source host's own ssh",
            "",
        ),
    ],
)
def test_the_direct_hop_does_not_read_this_machines_ssh_config(tmp_path, extra, where, why):
    lines = problems(tmp_path, host_config("/etc/rb/ssh_config", extra))
    assert len(lines) == 1 and where in lines[0], lines


def test_a_local_host_takes_no_ssh_config(tmp_path):
    text = f"name: o\n{HOSTS}".replace(
        "{ssh: root@dst.example}", "{local: true, ssh_config: /etc/rb/ssh_config}"
    )
    lines = problems(tmp_path, text)
    assert (
        len(lines) == 1
        and "(port, identity_file, jump, options, ssh_config) need `ssh:`" in lines[0]
    ), lines
