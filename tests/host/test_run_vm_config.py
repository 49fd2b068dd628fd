"""scripts/run-vm: variable validation and exit-status decoding (no VM)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def _load():
    loader = importlib.machinery.SourceFileLoader("run_vm", str(ROOT / "scripts/run-vm"))
    spec = importlib.util.spec_from_loader("run_vm", loader)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["run_vm"] = mod  # dataclasses look their module up
    loader.exec_module(mod)
    return mod


run_vm = _load()


def validate(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--validate"],
        env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize(
    ("var", "value", "accepted"),
    [
        ("IOMMU", "bogus", "strict, lazy, pt, off"),
        ("KERNEL", "9.9", "6.12.N"),
        ("VFS", "9", "0 to 4"),
        ("VFS", "-1", "0 to 4"),
        ("MEM", "lots", "1024M or 2G"),
        ("MEM", "64M", "512M or more"),
        ("ICOUNT", "2", "1 (-icount"),
        ("SMP", "0", "1 to 8"),
        ("VIRTIO", "2", "1 (a virtio-tacc-pci) or 0"),
        ("NVME", "yes", "1 (an NVMe scratch disk) or 0"),
        ("NVME_MB", "0", "MiB from 1 to 4096"),
    ],
)
def test_bad_value_one_clear_line(var: str, value: str, accepted: str) -> None:
    r = validate(**{var: value})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"run-vm: {var}={value}")
    assert accepted in lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("iommu", ["strict", "lazy", "pt", "off"])
def test_good_values_accepted(iommu: str) -> None:
    r = validate(IOMMU=iommu, VFS="4", MEM="1024M", KERNEL="6.12.117")
    assert r.returncode == 0, r.stderr


def test_iommu_modes_reach_qemu_and_kernel(tmp_path: Path) -> None:
    for mode, dev, arg in [("strict", True, "iommu.strict=1"), ("lazy", True, "iommu.strict=0"),
                           ("pt", True, "iommu.passthrough=1"), ("off", False, "intel_iommu=off")]:
        cfg = run_vm.VMConfig.from_env({"IOMMU": mode, "KERNEL": "6.12.117"},
                                       require_installed=False)
        argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
        assert ("intel-iommu,intremap=on" in argv) == dev
        assert arg in argv[argv.index("-append") + 1]


def test_icount_guest_keeps_its_tick(tmp_path: Path) -> None:
    """Under -icount sleep=off an idle tickless guest's clock jumps to its next timer, which
    can be a 120 s timeout while the guest waits for 9p (seen: a test's subprocess timed out
    after 4.9 s of wall): the icount guest boots with nohz=off, a host-time guest without."""
    for icount, tick in (("1", True), ("0", False)):
        cfg = run_vm.VMConfig.from_env({"ICOUNT": icount, "KERNEL": "6.12.117"},
                                       require_installed=False)
        argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
        assert ("-icount" in argv) == (icount == "1")
        assert ("nohz=off" in argv[argv.index("-append") + 1].split()) == tick


def test_py_disks_made_when_their_tree_changes_and_attached_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PYDISK: an ext4 image per Python tree, made again only when a file or directory in
    it changed (pip; not its bytecode caches), attached read-only after every other device
    (their slots and the guest's BDFs unchanged) and named to guest-init with the path it
    covers; PYDISK=0 and a VM inside the test VM: none."""
    if not shutil.which("mke2fs"):
        pytest.fail("mke2fs is not installed (e2fsprogs)")
    venv, lib = tmp_path / "venv", tmp_path / "lib"
    (venv / "lib/site-packages/pkg").mkdir(parents=True)
    (venv / "lib/site-packages/pkg/__init__.py").write_text("x = 1\n")
    (lib / "json").mkdir(parents=True)
    (lib / "json/__init__.py").write_text("")
    monkeypatch.setattr(run_vm, "ROOT", tmp_path)
    monkeypatch.setattr(run_vm, "py_disks", lambda: [run_vm.PyDisk("venv", venv),
                                                     run_vm.PyDisk("stdlib", lib)])
    cfg = run_vm.VMConfig.from_env({"KERNEL": "6.12.117"}, require_installed=False)
    said: list[str] = []

    def ensure() -> list[str]:
        got = run_vm.ensure_py_disks(cfg, say=lambda *a, **_k: said.append(" ".join(map(str, a))))
        return [d.name for d in got]

    assert ensure() == ["venv", "stdlib"]
    img = tmp_path / "build/venv.img"
    r = subprocess.run(["debugfs", "-R", "cat /lib/site-packages/pkg/__init__.py", str(img)],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == "x = 1\n", (r.stdout, r.stderr)
    stamp = img.with_suffix(".stamp").read_text()
    mtime = img.stat().st_mtime_ns
    ensure()
    assert img.stat().st_mtime_ns == mtime  # unchanged tree: the image is kept
    (venv / "lib/site-packages/pkg/__pycache__").mkdir()
    (venv / "lib/site-packages/pkg/__pycache__/m.cpython-311.pyc").write_bytes(b"x")
    ensure()
    assert img.stat().st_mtime_ns == mtime  # bytecode caches (host pytest writes them): kept
    (venv / "lib/site-packages/pkg/m.py").write_text("y = 2\n")
    ensure()
    assert img.with_suffix(".stamp").read_text() != stamp  # a new module (pip): made again
    argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
    drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
    assert drives == [f"file={tmp_path}/build/{n}.img,if=none,id={n},format=raw,readonly=on"
                      for n in ("venv", "stdlib")]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert devices[-2:] == ["virtio-blk-pci,drive=venv,serial=tacc-venv",
                            "virtio-blk-pci,drive=stdlib,serial=tacc-stdlib"]
    append = argv[argv.index("-append") + 1].split()
    assert f"taccvm.pydisks=tacc-venv:{venv},tacc-stdlib:{lib}" in append
    for env in ({"PYDISK": "0"}, {"TACC_IN_VM": "1"}):
        off = run_vm.VMConfig.from_env({"KERNEL": "6.12.117", **env}, require_installed=False)
        argv = run_vm.qemu_argv(off, tmp_path, None, interactive=False)
        assert "-drive" not in argv and "taccvm.pydisks" not in argv[argv.index("-append") + 1]
    assert validate(PYDISK="yes").returncode == 2
    init = (ROOT / "scripts/guest-init.sh").read_text()
    assert "taccvm.pydisks=*" in init and "/sys/block/vd*/serial" in init


def test_py_disks_are_the_trees_python_reads() -> None:
    names = {d.name: d.source for d in run_vm.py_disks()}
    assert names["venv"] == ROOT / ".venv" and names["userspace"] == ROOT / "userspace"
    assert names["stdlib"] == Path(sysconfig.get_paths()["stdlib"])


@given(st.integers(min_value=0, max_value=254))
def test_exit_status_roundtrip(status: int) -> None:
    # isa-debug-exit: the guest writes status + 1, QEMU exits (v << 1) | 1.
    rc = ((status + 1) << 1) | 1
    assert run_vm.decode_status(rc, None) == status


@given(st.one_of(st.none(), st.integers(min_value=0, max_value=254)))
def test_qemu_failure_is_never_success(sentinel: int | None) -> None:
    # QEMU's own failure exits 1 (= "guest wrote 0"): never read as success
    # unless the guest printed its sentinel line.
    got = run_vm.decode_status(1, sentinel)
    assert got == (sentinel if sentinel is not None else 125)
    assert run_vm.decode_status(0, None) != 0


def test_module_importable_with_stdlib_only() -> None:
    # run-vm must work before the venv exists.
    code = "import ast,sys; ast.parse(open(sys.argv[1]).read())"
    r = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT / "scripts/run-vm")],
                       capture_output=True, timeout=30)
    assert r.returncode == 0


@pytest.mark.parametrize(("var", "value"), [("IOMMU", "bogus"), ("KERNEL", "9.9"), ("VFS", "7")])
def test_make_run_vm_bad_value_stops_first(var: str, value: str) -> None:
    # `make run-vm` checks the variables before any set-up step runs.
    r = subprocess.run(["make", "-s", "run-vm", f"{var}={value}", "CMD=true"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{var}={value}" in lines[0] and "accepted" in lines[0], r.stderr
    assert r.stdout == ""


# ---- make run-vm -> scripts/run-vm -> QEMU, with a stand-in QEMU (TACC_QEMU) that runs
# the guest command file on the host the way scripts/guest-init.sh does, saves what it was
# handed, and exits the way isa-debug-exit makes QEMU exit.

FAKE_QEMU = r'''#!/usr/bin/python3
import os, re, subprocess, sys
argv = sys.argv[1:]
save = os.environ["FAKE_QEMU_SAVE"]
with open(save + ".argv", "w") as f:
    f.write("\n".join(argv) + "\n")
append = argv[argv.index("-append") + 1]
m = re.search(r"taccvm\.cmd=(\S+)", append)
if m is None:  # interactive: the "guest shell" exits 3 at once
    st = 3
else:
    with open(m.group(1), "rb") as src, open(save + ".cmd", "wb") as dst:
        dst.write(src.read())
    st = subprocess.run(["bash", m.group(1)], stdin=subprocess.DEVNULL).returncode
print(f"TACC-EXIT: {st}", flush=True)
sys.exit(((st + 1) << 1) | 1)
'''


@pytest.fixture
def fake_qemu(tmp_path: Path) -> dict[str, str]:
    q = tmp_path / "fake-qemu"
    q.write_text(FAKE_QEMU)
    q.chmod(0o755)
    return {**os.environ, "TACC_QEMU": str(q), "FAKE_QEMU_SAVE": str(tmp_path / "saved"),
            "SETUP_QUIET": "1", "PYDISK": "0"}


def make_run_vm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # -o setup: the recipe under test, not the (warm, ~3 s) set-up step before it
    return subprocess.run(["make", "--no-print-directory", "-o", "setup", "run-vm", *args],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)


# What the README promises: CMD reaches the guest byte for byte, except `$$` -> `$`.
CMD_CASES = [
    ("f=$(mktemp -u); echo $f", "f=$(mktemp -u); echo $f"),
    ("echo $$TACC_VM_OUT/cap.html", "echo $TACC_VM_OUT/cap.html"),
    ("""printf '%s|%s\\n' "$HOME" 'a b'  # ${x:-y} `true` \\ "q" """,
     """printf '%s|%s\\n' "$HOME" 'a b'  # ${x:-y} `true` \\ "q" """),
    ("echo $$$$ $(( 6 * 7 ))", "echo $$ $(( 6 * 7 ))"),
    ("true &&\n  echo -o $$TACC_VM_OUT/c;\n  f=$(echo x)",
     "true &&\n  echo -o $TACC_VM_OUT/c;\n  f=$(echo x)"),  # README's chain: lines
]


@pytest.mark.parametrize(("cmd", "guest"), CMD_CASES)
def test_make_run_vm_cmd_reaches_guest_byte_for_byte(fake_qemu: dict[str, str], cmd: str,
                                                     guest: str, tmp_path: Path) -> None:
    r = make_run_vm(fake_qemu, f"CMD={cmd}")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "saved.cmd").read_text() == guest + "\n"


def test_make_run_vm_cmd_from_environment(fake_qemu: dict[str, str], tmp_path: Path) -> None:
    r = make_run_vm({**fake_qemu, "CMD": "f=$(mktemp -u); echo $$f"})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "saved.cmd").read_text() == "f=$(mktemp -u); echo $f\n"


def test_make_run_vm_mktemp_runs(fake_qemu: dict[str, str]) -> None:
    r = make_run_vm(fake_qemu, "CMD=f=$(mktemp -u); echo $f")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"/tmp/tmp\.\w+", r.stdout.splitlines()[-1]), r.stdout  # after setup's


def test_make_run_vm_exit_status_line(fake_qemu: dict[str, str]) -> None:
    # GNU make exits 2 whenever a recipe fails; run-vm names the guest's status on the line
    # before make's own.
    r = make_run_vm(fake_qemu, "CMD=exit 3")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-2:][0] == "run-vm: guest command exited with status 3", r.stderr
    # make's own line; "make[1]:" when this test runs under make (make test)
    assert re.match(r"make(\[\d+\])?: \*\*\* \[Makefile:\d+: run-vm\] Error 3$", lines[-1]), lines


@pytest.mark.parametrize("status", [0, 3, 42])
def test_scripts_run_vm_carries_exact_status(fake_qemu: dict[str, str], status: int) -> None:
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "scripts/run-vm"), "--cmd",
                        f"exit {status}"], env=fake_qemu, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == status
    want = [f"run-vm: guest command exited with status {status}"] if status else []
    assert r.stderr.strip().splitlines() == want


def _run_vm_in_pty(env: dict[str, str], rows: int, cols: int) -> int:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    p = subprocess.Popen(["/usr/bin/python3", str(ROOT / "scripts/run-vm")], env=env,
                         stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        while True:  # drain, or the child blocks on a full pty
            try:
                if not os.read(master, 4096):
                    break
            except OSError:
                break
        return p.wait(timeout=60)
    finally:
        os.close(master)


def test_interactive_console_size_and_ctrl_c(fake_qemu: dict[str, str], tmp_path: Path) -> None:
    # The host terminal's rows and columns reach the guest; Ctrl-C on the serial console is
    # a byte for the guest (signal=off), not SIGINT for QEMU; Ctrl-A x still quits (mux).
    assert _run_vm_in_pty({**fake_qemu, "TERM": "xterm-256color"}, 37, 111) == 3
    argv = (tmp_path / "saved.argv").read_text().splitlines()
    append = argv[argv.index("-append") + 1].split()
    assert "taccvm.tty=37x111" in append
    assert "taccvm.term=xterm-256color" in append
    chardevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-chardev"]
    stdio = [c for c in chardevs if c.startswith("stdio,")]
    assert len(stdio) == 1, chardevs
    opts = stdio[0].split(",")
    assert "signal=off" in opts and "mux=on" in opts
    cid = next(o for o in opts if o.startswith("id=")).removeprefix("id=")
    assert argv[argv.index("-serial") + 1] == f"chardev:{cid}"
    assert any(argv[i + 1].startswith(f"chardev={cid}") for i, a in enumerate(argv)
               if a == "-mon"), "no monitor on the mux (Ctrl-A c)"


def test_make_help_lists_every_variable() -> None:
    r = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    for var in ("IOMMU", "VFS", "MEM", "KERNEL", "SMP", "VIRTIO", "ICOUNT", "MODPARAMS",
                "QEMU_ARGS", "KERNEL_ARGS", "CMD", "PYTEST_ARGS", "TEST_VM_CONFIGS", "PYDISK",
                "NVME"):
        lines = [ln for ln in r.stdout.splitlines() if re.match(rf"\s*{var}\s", ln)]
        assert len(lines) == 1, f"{var}: {lines} in\n{r.stdout}"
        assert len(lines[0].split()) >= 3, lines[0]  # the name, then what it does


# ---- the guest's interactive shell: its own rc file, not the host's dotfiles over 9p

def test_guest_shell_uses_its_own_rc(tmp_path: Path) -> None:
    init = (ROOT / "scripts/guest-init.sh").read_text()
    shell = [ln for ln in init.splitlines() if "setsid" in ln and "bash" in ln]
    assert len(shell) == 1, shell
    assert '--rcfile "$root/scripts/guest-bashrc"' in shell[0] and " -l" not in shell[0]
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("PATH=/nowhere; PS1='host> '\n")
    (home / ".tacc-vm-rc").write_text("export FROM_TACC_VM_RC=yes\n")
    env = {"HOME": str(home), "TACC_ROOT": str(ROOT), "TACC_VM_IOMMU": "pt",
           "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    r = subprocess.run(["bash", "--rcfile", str(ROOT / "scripts/guest-bashrc"), "-i"],
                       input='echo "P=${PS1@P}"; echo "T=$(type -p tacc)"; '
                             'echo "R=$FROM_TACC_VM_RC"\n',
                       env=env, capture_output=True, text=True, timeout=30)
    out = r.stdout.splitlines()
    assert f"T={ROOT}/.venv/bin/tacc" in out, r.stdout
    assert "R=yes" in out
    prompt = next(ln for ln in out if ln.startswith("P="))
    assert "tacc-vm" in prompt and "pt" in prompt, prompt


# ---- scripts/test-vm: which skips a run may have

def _load_test_vm():
    loader = importlib.machinery.SourceFileLoader("test_vm", str(ROOT / "scripts/test-vm"))
    spec = importlib.util.spec_from_loader("test_vm", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _junit_with_skips(path: Path, reasons: list[str]) -> Path:
    from xml.sax.saxutils import quoteattr
    cases = "".join(f'<testcase classname="t" name="c{i}"><skipped type="pytest.skip" '
                    f'message={quoteattr(r)}>x</skipped></testcase>'
                    for i, r in enumerate(reasons))
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


@pytest.mark.parametrize("reason", [
    "no longer supported by this kernel",
    "the long way round",
    "TACC_LONG is not how this is spelled",
    "prefix long test: make test-long",
    "long test: make test-long, and then some",
    "whatever VFs already enabled",
])
def test_skip_reason_merely_mentioning_long_is_not_allowed(tmp_path: Path, reason: str) -> None:
    tv = _load_test_vm()
    assert tv.unexpected_skips(_junit_with_skips(tmp_path / "j.xml", [reason])) != []


def test_long_marker_skip_and_vf_config_skips_allowed(tmp_path: Path) -> None:
    tv = _load_test_vm()
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import conftest as tests_conftest
    finally:
        sys.path.pop(0)
    reasons = [tests_conftest.LONG_SKIP_REASON, "VFs already enabled by the VM configuration",
               "VFs already enabled in this configuration"]
    assert tv.unexpected_skips(_junit_with_skips(tmp_path / "j.xml", reasons)) == []


def test_long_marked_test_skips_with_the_markers_reason(tmp_path: Path) -> None:
    # The reason test-vm allows is the one the `long` marker produces, whatever else the
    # test carries (a redundant skipif would otherwise win and need its own exception).
    t = tmp_path / "test_x.py"
    t.write_text("import pytest\n@pytest.mark.long\ndef test_heavy():\n    pass\n")
    shutil.copy(ROOT / "tests/conftest.py", tmp_path / "conftest.py")
    env = {k: v for k, v in os.environ.items() if k != "TACC_LONG"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        f"--junitxml={tmp_path}/j.xml", str(t)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    assert _load_test_vm().unexpected_skips(tmp_path / "j.xml") == []
    assert 'skipped' in (tmp_path / "j.xml").read_text()


# ---- scripts/test-vm: which settings make test and make test-long boot

def _boots(tv, names: str) -> list[dict[str, str]]:
    return [{"IOMMU": "strict", "VFS": "0", "SMP": "1", "ICOUNT": "1", **tv.CONFIGS[n]}
            for n in names.split()]


def test_every_documented_setting_is_booted() -> None:
    # README's variables: every IOMMU mode, VFs at boot, SMP>1 and ICOUNT=0 each get a boot,
    # in make test (default set) or make test-long (--set long).
    tv = _load_test_vm()
    default, long = _boots(tv, tv.DEFAULT_CONFIGS), _boots(tv, tv.LONG_CONFIGS)
    every = default + long
    assert {b["IOMMU"] for b in every} == {"strict", "lazy", "pt", "off"}
    extras = [b for b in default if int(b["VFS"]) > 0 and int(b["SMP"]) > 1]
    assert extras, f"make test boots no VFS>0 SMP>1 configuration: {default}"
    assert any(b["ICOUNT"] == "0" for b in long)
    assert "--set long" in (ROOT / "scripts/test.sh").read_text()


def test_extras_files_exist_and_run_once() -> None:
    tv = _load_test_vm()
    assert tv.CONFIG_TESTS["extras"] is tv.EXTRAS_TESTS
    for f in tv.EXTRAS_TESTS:
        assert (ROOT / f).is_file(), f
    assert "tests/vm/test_readme.py" in tv.EXTRAS_TESTS
    sharded = [f for _, files in tv.strict_shards() for f in files]
    assert len(sharded) == len(set(sharded))
    assert not set(tv.EXTRAS_ONLY) & set(sharded)


def test_long_tests_carry_no_skip_of_their_own() -> None:
    # A `long` test skips through the marker alone (tests/conftest.py): a skipif on
    # TACC_LONG would win with another reason, which test-vm rightly refuses.
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "tests").rglob("test_*.py")
           for i, ln in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"@pytest\.mark\.skipif\(.*TACC_LONG", ln)]
    assert not bad, bad


def test_make_test_covers_every_iommu_mode_by_boot_or_domain_pass() -> None:
    tv = _load_test_vm()
    modes = {b["IOMMU"] for b in _boots(tv, tv.DEFAULT_CONFIGS)} | set(tv.DOMAIN_PASSES)
    assert modes == {"strict", "lazy", "pt"}
    assert set(tv.DOMAIN_PASSES.values()) <= {"DMA-FQ", "identity"}
    # and each pass's mode still boots for real (its kernel command line) in make test-long
    assert set(tv.DOMAIN_PASSES) <= {b["IOMMU"] for b in _boots(tv, tv.LONG_CONFIGS)}


def _passes_status(tmp_path: Path, main: int, codes: list[int], args: list[str],
                   last: str = "") -> tuple[int, str]:
    """Run domain_passes_cmd's shell with a fake .venv/bin/python whose nth call exits
    with codes[n] and logs its environment."""
    tv = _load_test_vm()
    venv = tmp_path / ".venv/bin"
    venv.mkdir(parents=True)
    (tmp_path / "codes").write_text(" ".join(map(str, codes)))
    (venv / "python").write_text(
        "#!/bin/sh\nset -- $(cat codes); c=$1; shift; echo \"$@\" > codes\n"
        "echo \"$TACC_VM_CONFIG $TACC_VM_DOMAIN $TACC_VM_EXPECT\" >> calls\nexit $c\n")
    (venv / "python").chmod(0o755)

    class Cfg:
        vfs, smp, icount, virtio = "0", "1", True, False

    cmd = tv.domain_passes_cmd(f"(exit {main})", Cfg(), args, tmp_path / "out", last)
    r = subprocess.run(["sh", "-c", cmd], cwd=tmp_path, capture_output=True, text=True,
                       timeout=30)
    return r.returncode, (tmp_path / "calls").read_text()


def test_domain_passes_status_is_the_first_failure(tmp_path: Path) -> None:
    st, calls = _passes_status(tmp_path / "a", 0, [0, 0], [])
    assert st == 0
    assert calls.splitlines() == ["lazy DMA-FQ IOMMU=lazy VFS=0 SMP=1 ICOUNT=1 VIRTIO=0",
                                  "pt identity IOMMU=pt VFS=0 SMP=1 ICOUNT=1 VIRTIO=0"]
    assert _passes_status(tmp_path / "b", 0, [0, 3], [])[0] == 3
    assert _passes_status(tmp_path / "c", 2, [0, 3], [])[0] == 2  # the main session's first
    # a pass whose -k chose nothing (pytest 5) passes only when a selection was given
    assert _passes_status(tmp_path / "d", 0, [5, 0], [])[0] == 5
    assert _passes_status(tmp_path / "e", 0, [5, 0], ["-k", "copy"])[0] == 0
    # the files that take the device away run after the passes, their status counted
    last = "TACC_VM_CONFIG=strict TACC_VM_EXPECT=x .venv/bin/python -m pytest t_zz.py"
    st, calls = _passes_status(tmp_path / "f", 0, [0, 0, 4], [], last)
    assert st == 4 and calls.splitlines()[-1] == "strict  x"
    assert [c.split()[0] for c in calls.splitlines()] == ["lazy", "pt", "strict"]
    assert _passes_status(tmp_path / "g", 0, [0, 0, 5], ["-k", "x"], last)[0] == 0


def test_wall_profile_per_test_and_file(tmp_path: Path) -> None:
    tv = _load_test_vm()
    t = tmp_path / "console.times"
    t.write_text("2.00 [    0.0] Linux version 6.12\n"
                 "30.50 ============================= test session starts ====\n"
                 "30.75 collecting ... collected 3 items\n"
                 "31.00 tests/vm/test_a.py::test_x PASSED\n"
                 "35.00 tests/vm/test_a.py::test_y[1] FAILED\n"
                 "40.00 tests/vm/test_b.py::test_z SKIPPED (long test)\n"
                 "41.00 ============ 1 passed, 1 failed, 1 skipped in 10.2s =====\n"
                 "41.50 test-vm: domain pass pt (identity)\n"
                 "42.00 ============================= test session starts ====\n"
                 "42.50 collecting ... collected 1 item\n"
                 "44.50 tests/vm/test_a.py::test_x PASSED\n"
                 "45.00 ============ 1 passed in 2.0s =====\n"
                 "47.00 TACC-EXIT: 0\n")
    prof = tv.wall_profile(t)
    assert (prof["boot_s"], prof["pytest_s"], prof["after_s"]) == (30.5, 14.5, 2.0)
    assert prof["collect_s"] == 0.75
    assert prof["files"] == {"tests/vm/test_b.py": 5.0, "tests/vm/test_a.py": 4.25,
                             "[pt] tests/vm/test_a.py": 2.0}
    assert prof["tests"][0] == ("tests/vm/test_b.py::test_z", 5.0)
    assert tv.wall_profile(tmp_path / "missing") == {}


def test_guest_pyc_writes_what_the_guest_pytest_loads() -> None:
    """scripts/guest-pyc (run by test-vm before the boots): the guest's / is read-only, so
    the host writes the assert-rewritten modules; pytest must find each valid (its source
    hash), for the tests/vm files and for the hypothesis plugin's package, even with
    PYTHONDONTWRITEBYTECODE set (as this harness's environment has it)."""
    from _pytest.assertion import rewrite

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "scripts/guest-pyc")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    import hypothesis

    for fn in (ROOT / "tests/vm/conftest.py", ROOT / "tests/vm/test_e2e_real.py",
               Path(hypothesis.__file__)):
        pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
        assert rewrite._read_pyc(fn, pyc) is not None, f"{pyc}: missing or stale"
    assert (ROOT / "userspace/tacc/capture/__pycache__").is_dir()


def _a_pci_function() -> str:
    fns = sorted(p.name for p in Path("/sys/bus/pci/devices").glob("*"))
    if not fns:
        pytest.skip("this machine shows no PCI function in sysfs")
    return fns[0]


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"PASSTHROUGH": "01:00.2"}, "PASSTHROUGH=01:00.2: accepted: a PCI function like"),
        ({"PASSTHROUGH": "0000:7f:1f.7"}, "PASSTHROUGH=0000:7f:1f.7: no such PCI function"),
        ({"IOMMU": "strict"}, "PASSTHROUGH with IOMMU=strict: accepted: IOMMU=off"),
        ({"VFS": "2"}, "PASSTHROUGH with VFS: accepted: no VFS"),
        ({"VIRTIO": "1"}, "PASSTHROUGH with VIRTIO: accepted: no VIRTIO"),
        ({"NODES": "2"}, "PASSTHROUGH with NODES: accepted: no NODES"),
    ],
)
def test_passthrough_refusals_one_line(env: dict[str, str], words: str) -> None:
    r = validate(**{"PASSTHROUGH": _a_pci_function(), **env})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("run-vm: " + words), lines[0]


def test_passthrough_replaces_the_tacc_device(tmp_path: Path) -> None:
    """PASSTHROUGH=: vfio-pci on the root port instead of the tacc device, no vIOMMU,
    host time by default (a nested guest, docs/vfio.md)."""
    bdf = _a_pci_function()
    cfg = run_vm.VMConfig.from_env({"PASSTHROUGH": bdf, "KERNEL": "6.12.117"},
                                   require_installed=False)
    argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
    devs = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert f"vfio-pci,host={bdf},bus=rp0,id=pt0" in devs
    assert not [d for d in devs if d.startswith(("tacc,", "intel-iommu", "virtio-tacc"))], devs
    assert "-icount" not in argv and "intel_iommu=off" in argv[argv.index("-append") + 1]
    cfg = run_vm.VMConfig.from_env({"PASSTHROUGH": bdf, "ICOUNT": "1", "KERNEL": "6.12.117"},
                                   require_installed=False)
    assert "-icount" in run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)


def test_results_copy_leaves_sockets_out(tmp_path: Path) -> None:
    """A VM killed on timeout leaves QEMU's sockets in its run directory; copying the run
    to build/test-results must skip them (shutil.Error, errno 6, before)."""
    import socket

    loader = importlib.machinery.SourceFileLoader("test_vm", str(ROOT / "scripts/test-vm"))
    spec = importlib.util.spec_from_loader("test_vm", loader)
    tv = importlib.util.module_from_spec(spec)
    sys.modules["test_vm"] = tv
    loader.exec_module(tv)
    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    (run / "console.log").write_text("x")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run / "qmp.sock"))
    try:
        shutil.copytree(run, tmp_path / "copy", ignore=tv._sockets)
    finally:
        s.close()
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["console.log", "out"]


def test_make_test_boots_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    # two nodes boot side by side in make test; the cluster is the
    # last job, so it takes the lane that frees first; a -m selection that none of its tests
    # match (make test-long's -m long pass) boots nothing.  make test's nodes capture
    # without BPF (unless TACC_CLUSTER_BPF=1); make test-long boots them again with it
    tv = _load_test_vm()
    assert tv.DEFAULT_CONFIGS.split()[-1] == "cluster"
    assert "cluster" not in tv.LONG_CONFIGS.split()
    assert "cluster-bpf" in tv.LONG_CONFIGS.split()
    assert "cluster-bpf" not in tv.DEFAULT_CONFIGS.split()
    monkeypatch.delenv("TACC_CLUSTER_BPF", raising=False)
    assert tv.cluster_bpf("cluster") == "0"
    assert tv.cluster_bpf("cluster-bpf") == "1"
    monkeypatch.setenv("TACC_CLUSTER_BPF", "1")
    assert tv.cluster_bpf("cluster") == "1"
    for name in ("cluster", "cluster-bpf"):
        assert tv.CONFIGS[name]["NODES"] == "2" and tv.CONFIGS[name]["ICOUNT"] == "0"
        assert tv.CONFIG_TESTS[name] == tv.CLUSTER_TESTS
    assert not tv._collects(tv.CLUSTER_TESTS, ["-m", "long"])
    assert tv._collects(tv.CLUSTER_TESTS, ["-m", "not long"])


def test_after_boot_tests_run_on_what_the_readme_kept(tmp_path: Path) -> None:
    # a boot whose README tests kept files (out/readme/) runs tests/after_boot on the host;
    # without TACC_VM_RESULTS the test fails (not skipped), and on a kept model view without
    # the model report it fails too
    tv = _load_test_vm()
    assert tv.AFTER_BOOT_TESTS == ["tests/after_boot"]
    (tmp_path / "out" / "readme").mkdir(parents=True)
    (tmp_path / "out" / "readme" / "model.html").write_text(
        '<script id="data" type="application/json">{"tracks": [], "slices": []}</script>')
    assert tv.host_tests("t", tv.AFTER_BOOT_TESTS, {"TACC_VM_RESULTS": ""}, tmp_path) != 0
    assert "TACC_VM_RESULTS must name" in (tmp_path / "host-tests.log").read_text()
    st = tv.host_tests("t", tv.AFTER_BOOT_TESTS, {"TACC_VM_RESULTS": str(tmp_path / "out")},
                       tmp_path)
    assert st != 0 and "no model report" in (tmp_path / "host-tests.log").read_text()


def test_bench_takes_its_own_run_directory() -> None:
    # make bench copies its boot's JSON from the run directory run-vm names on stderr,
    # never "the newest /tmp/tacc-vm-*" (another VM's, which it then removed)
    bench = (ROOT / "scripts/bench.sh").read_text()
    assert "ls -dt /tmp/tacc-vm-" not in bench
    pat = re.search(r"sed -n '(s/[^']*)'", bench)
    assert pat, "bench.sh no longer parses run-vm's kept-directory line"
    assert 'f"run-vm: kept the run directory {run_dir} (' in (ROOT / "scripts/run-vm").read_text()
    line = "run-vm: kept the run directory /tmp/tacc-vm-x1 (guest files: /tmp/tacc-vm-x1/out)\n"
    r = subprocess.run(["sed", "-n", pat.group(1)], input=line, capture_output=True, text=True)
    assert r.stdout.strip() == "/tmp/tacc-vm-x1"


# ---- PYTEST_ARGS as a shell splits it: a quoted multi-word -k is one expression

def test_quoted_k_reaches_pytest_as_one_expression(tmp_path: Path) -> None:
    # collected from test_readme.py only (the other files' collection costs seconds)
    args = ('-k "readme_has_each_kind or every_readme_sh_block" --collect-only '
            "--ignore-glob='tests/host/test_[!r]*' --ignore-glob='tests/host/test_r[!e]*' "
            "--ignore-glob='tests/host/test_rea[!d]*' "
            f"--junitxml={tmp_path}/j.xml")
    r = subprocess.run(["scripts/test.sh", "host"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTEST_ARGS": args}, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert re.search(r"^2/\d+ tests collected", r.stdout, re.M), r.stdout[-2000:]
    r = subprocess.run(["scripts/test.sh", "host"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTEST_ARGS": '-k "unclosed'}, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "test: PYTEST_ARGS: cannot split like a shell: No closing quotation"]


def test_test_vm_option_values_are_not_paths() -> None:
    tv = _load_test_vm()
    args = shlex.split('-k "vfio or cdi" -m kernel -x tests/vm/test_vfio.py::test_a -k docs')
    paths, rest = tv.split_pytest_args(args)
    assert paths == ["tests/vm/test_vfio.py::test_a"]
    assert rest == ["-k", "vfio or cdi", "-m", "kernel", "-x", "-k", "docs"]
    cfg = run_vm.VMConfig.from_env({"KERNEL": "6.12.117"}, require_installed=False)
    cmd = tv.domain_passes_cmd("true", cfg, shlex.split('-k "platform and not vf"'), Path("/o"))
    assert "'platform and not vf'" in cmd and cmd.count("-k") == len(tv.DOMAIN_PASSES)


def test_boot_summary_gives_the_totals_of_every_pass(tmp_path: Path) -> None:
    tv = _load_test_vm()
    for name, (tests, fail, skip) in {"junit.xml": (26, 1, 2), "junit-lazy.xml": (9, 0, 0),
                                      "junit-pt.xml": (9, 0, 1)}.items():
        (tmp_path / name).write_text(
            f'<testsuites><testsuite name="pytest" errors="0" failures="{fail}" '
            f'skipped="{skip}" tests="{tests}" time="1"/></testsuites>')
    junits = sorted(tmp_path.glob("junit*.xml"))
    assert tv.boot_totals(junits) == "40 passed, 1 failed, 3 skipped in 3 pytest runs"
    assert tv.boot_totals([]) == "no pytest results"
    src = (ROOT / "scripts/test-vm").read_text()
    assert src.count("totals = boot_totals(") == 2  # the single-VM and the cluster boot


def test_failed_tests_are_named_from_every_layers_junit(tmp_path: Path) -> None:
    # a CI log keeps its tail: make test ends with the failed tests' names, from each
    # layer's and each boot's junit written during this run (an older file is not this run's)
    tv = _load_test_vm()
    boot = tmp_path / "vm-strict/out"
    boot.mkdir(parents=True)
    (boot / "junit.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="1">'
        '<testcase classname="tests.vm.test_pm" name="test_cycle">'
        '<failure message="assert 3 == 4&#10;second line">tb</failure></testcase>'
        '<testcase classname="tests.vm.test_pm" name="test_setup"><error message="">x'
        '</error></testcase><testcase classname="tests.vm.test_pm" name="test_ok"/>'
        '</testsuite></testsuites>')
    (tmp_path / "host.xml").write_text("<testsuites><testsuite tests='1'><testcase "
                                       "classname='h' name='t'/></testsuite></testsuites>")
    (tmp_path / "bad.xml").write_text("<testsuites")
    assert tv.failed_cases(tmp_path) == [
        "vm-strict/out/junit.xml: tests.vm.test_pm::test_cycle: failure: assert 3 == 4",
        "vm-strict/out/junit.xml: tests.vm.test_pm::test_setup: error: x"]
    old = tmp_path / "vm-strict/out/junit.xml"
    os.utime(old, (1000, 1000))
    assert tv.failed_cases(tmp_path, since=2000) == []
    r = subprocess.run([sys.executable, str(ROOT / "scripts/test-vm"), "--list-failures",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout.count("failed: ") == 2
    assert "--list-failures build/test-results" in (ROOT / "scripts/test.sh").read_text()


def test_guest_pytest_collects_every_vm_file_with_its_named_plugins() -> None:
    # the guest's pytest loads no entry-point plugin; what tests/vm uses must still be
    # there: pytest-timeout's ini option and marker (an unknown one is an error here)
    tv = _load_test_vm()
    words = shlex.split(tv.GUEST_PYTEST)
    assert words[0] == "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" and words[-2:] == ["-p", "pytest_timeout"]
    env = {**os.environ, "TACC_IN_VM": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = subprocess.run([str(ROOT / ".venv/bin/python"), *words[2:], "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-W", "error::pytest.PytestConfigWarning",
                        "-W", "error::pytest.PytestUnknownMarkWarning", "tests/vm"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "tests/vm/test_cluster.py::" in r.stdout
    src = (ROOT / "scripts/test-vm").read_text()
    # strict/extras, domain passes, the files after them, cluster nodes
    assert src.count("{GUEST_PYTEST} ") == 4


def test_lanes_take_extras_after_the_first_strict_shard() -> None:
    # the lanes take extras right after the first strict boot
    tv = _load_test_vm()
    jobs = [("strict", "strict-a", [], True), ("strict", "strict-b", [], False),
            ("extras", "extras", None, False), ("cluster", "cluster", None, False)]
    assert [j[1] for j in tv.lane_order(jobs)] == ["strict-a", "extras", "strict-b", "cluster"]
    assert [j[1] for j in tv.lane_order(jobs[2:])] == ["extras", "cluster"]
    assert [j[1] for j in tv.lane_order(jobs[:2])] == ["strict-a", "strict-b"]
    # on 2 cores strict is one boot of both shards' files, in shard order, domain passes on
    one = tv.strict_jobs(2)
    assert [(j[1], j[3]) for j in one] == [("strict", True)]
    assert one[0][2] == [f for _, files in tv.strict_shards() for f in files]
    assert [j[1] for j in tv.lane_order([*one, *jobs[2:]])] == ["strict", "extras", "cluster"]
    assert [(j[1], j[3]) for j in tv.strict_jobs(4)] == [("strict-a", True), ("strict-b", False)]


def test_nvme_scratch_disk_made_sparse_and_attached_last(tmp_path: Path) -> None:
    """NVME=1: a sparse raw image of NVME_MB MiB made anew in the run directory (a previous
    boot's bytes gone), behind QEMU's nvme after every other device, and its serial named
    to guest-init (which exports TACC_NVME_DEV); NVME=0: none."""
    cfg = run_vm.VMConfig.from_env({"KERNEL": "6.12.117", "NVME": "1", "NVME_MB": "16",
                                    "PYDISK": "0"}, require_installed=False)
    img = tmp_path / "nvme-scratch.img"
    img.write_bytes(b"old boot")
    argv = run_vm.qemu_argv(cfg, tmp_path, None, interactive=False)
    assert img.stat().st_size == 16 << 20 and img.stat().st_blocks == 0  # sparse, fresh
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]
    assert devices[-1] == "nvme,drive=nvme0,serial=tacc-scratch", devices
    assert f"file={img},if=none,id=nvme0,format=raw" in argv
    assert "taccvm.nvme=tacc-scratch" in argv[argv.index("-append") + 1].split()
    off = run_vm.VMConfig.from_env({"KERNEL": "6.12.117", "PYDISK": "0"},
                                   require_installed=False)
    argv = run_vm.qemu_argv(off, tmp_path / "x", None, interactive=False)
    assert not any(a.startswith("nvme,") or "id=nvme0" in a or "taccvm.nvme" in a
                   for a in argv)
    init = (ROOT / "scripts/guest-init.sh").read_text()
    assert "taccvm.nvme=*" in init and "TACC_NVME_DEV" in init and "modprobe -q nvme" in init
    mak = (ROOT / "qemu/configs/tacc-devices.mak").read_text()
    assert "CONFIG_NVME_PCI=y" in mak.splitlines()


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"MIGRATE": "yes"}, "MIGRATE=yes: accepted: 1 (the VM moves"),
        ({"MIGRATE": "1", "NODES": "2"}, "MIGRATE with NODES: accepted: one VM"),
        ({"MIGRATE": "1", "NVME": "1"}, "MIGRATE with NVME: accepted: one VM"),
        ({"MIGRATE": "bad", "PYDISK": "0"}, "MIGRATE with PYDISK=0: accepted: one VM"),
    ],
)
def test_migrate_refusals_one_line(env: dict[str, str], words: str) -> None:
    r = validate(**env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("run-vm: " + words), lines[0]


def test_migratable_vm_has_no_9p_root_and_its_destination_its_own_sockets(
        tmp_path: Path) -> None:
    """MIGRATE=: the migratable initramfs, no 9p root device (a mounted export blocks
    migration), the command named on the out share; a destination's monitors beside the
    source's under its own prefix, every device argument the same."""
    cfg = run_vm.VMConfig.from_env({"MIGRATE": "1", "KERNEL": "6.12.117"},
                                   require_installed=False)
    cmd = tmp_path / "out/cmd.sh"
    src = run_vm.qemu_argv(cfg, tmp_path, cmd, interactive=False)
    dst = run_vm.qemu_argv(cfg, tmp_path, cmd, interactive=False, sockets="dst1-")
    initrd = src[src.index("-initrd") + 1]
    assert initrd.endswith("initramfs-migratable-6.12.117+deb12-amd64.cpio.gz"), initrd
    devs = [src[i + 1] for i, a in enumerate(src) if a == "-device"]
    assert not [d for d in devs if "mount_tag=root" in d], devs
    assert [d for d in devs if "mount_tag=out" in d], devs
    append = src[src.index("-append") + 1].split()
    assert "taccvm.cmd=cmd.sh" in append and not [w for w in append if "taccvm.init" in w]
    socks = [a for a in dst if "qmp" in a and ".sock" in a]
    assert socks and all("/dst1-qmp" in a for a in socks), socks
    assert [a for a in src if ".sock" not in a] == [a for a in dst if ".sock" not in a]
    plain = run_vm.VMConfig.from_env({"KERNEL": "6.12.117"}, require_installed=False)
    argv = run_vm.qemu_argv(plain, tmp_path, tmp_path / "cmd.sh", interactive=False)
    assert [a for a in argv if "mount_tag=root" in a], "the ordinary boot keeps its 9p root"
    assert argv[argv.index("-initrd") + 1].endswith("/initramfs-6.12.117+deb12-amd64.cpio.gz")


def test_migratable_vm_with_vfs_and_virtio(tmp_path: Path) -> None:
    """MIGRATE=1 VFS=1 VIRTIO=1: accepted (the migratable init enables the VFs named on
    the kernel command line, as the ordinary init does); the source and a destination get
    the same virtio-tacc-pci device."""
    cfg = run_vm.VMConfig.from_env({"MIGRATE": "1", "VFS": "1", "VIRTIO": "1",
                                    "KERNEL": "6.12.117"}, require_installed=False)
    src = run_vm.qemu_argv(cfg, tmp_path, tmp_path / "out/cmd.sh", interactive=False)
    dst = run_vm.qemu_argv(cfg, tmp_path, tmp_path / "out/cmd.sh", interactive=False,
                           sockets="dst1-")
    assert "taccvm.vfs=1" in src[src.index("-append") + 1].split()
    vt = [a for a in src if a.startswith("virtio-tacc-pci,tacc=tacc0")]
    assert len(vt) == 1 and vt == [a for a in dst if a.startswith("virtio-tacc-pci,")], vt
    init = (ROOT / "scripts/guest-init-migratable.sh").read_text()
    assert "taccvm.vfs=*) vfs=" in init and 'enable_vfs "$vfs"' in init
    assert "scripts/guest-enable-vfs.sh" in run_vm.MIGRATABLE_SOURCES
    assert "/sriov_numvfs" in (ROOT / "scripts/guest-enable-vfs.sh").read_text()


def test_damaged_streams_cut_and_bump_the_tacc_section_version() -> None:
    """MIGRATE=bad's streams: the state cut in half, and the PF section's version 1 made 2
    (found by its id string, instance and version, not by an offset)."""
    idstr = b"0000:00:01.0:00.0/tacc"
    head = b"QEVM" + b"\0" * 20 + bytes([len(idstr)]) + b"0000:00:01.0:00.0/tacc.devmem"
    state = head + b"x" * 50 + bytes([len(idstr)]) + idstr + b"\0\0\0\0" + b"\0\0\0\1" + b"y" * 64
    got = dict(run_vm.damaged_streams(state))
    assert got["truncated"] == state[: len(state) // 2]
    v = got["version"]
    assert len(v) == len(state) and v != state
    at = v.rindex(idstr) + len(idstr)  # the section header, after the RAM block name
    assert v[at:at + 8] == b"\0\0\0\0\0\0\0\2" and v[:at] == state[:at]
    assert v[at + 8:] == state[at + 8:]
    assert set(dict(run_vm.damaged_streams(b"no device here" * 10))) == {"truncated"}
