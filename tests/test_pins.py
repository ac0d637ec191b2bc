"""environment.yml mirrors requirements.txt exactly (a loose torch pin pulls a multi-GB build)."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_requirements():
    reqs = [l.strip() for l in (ROOT / "requirements.txt").read_text().splitlines()
            if l.strip() and not l.startswith("#")]
    assert all("==" in r for r in reqs), "every top-level requirement is pinned exactly"
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(pip) == sorted(reqs)
