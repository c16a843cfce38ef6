# SPDX-License-Identifier: MIT
"""ibv_open_qp: a forked process opens another's XRC target QP by number
through a shared XRC domain, modifies it through its handle and closes the
handle; the QP lives on with its creator (tests/progs/sv_open_qp.c)."""
import pytest

import svtest


def test_open_xrc_target_qp_from_another_process(build_dir, env):
    prog = build_dir / "tests" / "progs" / "sv_open_qp"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog)], env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)


def test_cq_moderation_by_count(build_dir, env):
    """ibv_modify_cq with cq_count 4: the channel signals on the 4th
    completion, not before; a period is refused (tests/progs/sv_cq_mod.c)."""
    prog = build_dir / "tests" / "progs" / "sv_cq_mod"
    if not prog.exists():
        pytest.fail(f"{prog} missing: build with ninja -C {build_dir}")
    p = svtest.run([str(prog)], env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.stdout, p.stderr)
