"""Standard CLIP class names and prompt templates of the paper's datasets (pactlib/data/clip_prompts.json)
and how dataset folders are named with them (pactlib.data.paper.prompt_names)."""
import importlib.resources
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pactlib.data import paper

# Class counts of the datasets as the merging literature uses them (EMNIST: its 'digits' split).
KNOWN_COUNTS = {
    "SUN397": 397, "Cars": 196, "RESISC45": 45, "EuroSAT": 10, "SVHN": 10, "GTSRB": 43, "MNIST": 10, "DTD": 47,
    "CIFAR100": 100, "STL10": 10, "Flowers102": 102, "OxfordIIITPet": 37, "PCAM": 2, "FER2013": 7,
    "EMNIST": 10, "CIFAR10": 10, "Food101": 101, "FashionMNIST": 10, "RenderedSST2": 2, "KMNIST": 10,
}
EUROSAT_FOLDERS = ["AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture",
                   "PermanentCrop", "Residential", "River", "SeaLake"]


def _check_source(src):
    assert src["repo"].count("/") == 1 and src["path"], src
    assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), src


def test_every_paper_task_has_standard_names_and_templates():
    assert set(paper.prompt_tasks()) == set(paper.paper_tasks(20)) == set(KNOWN_COUNTS)
    for task in paper.paper_tasks(20):
        rec = paper.clip_prompts(task)
        assert len(rec.classnames) == KNOWN_COUNTS[task], task
        assert len(set(rec.classnames)) == len(rec.classnames) and all(n.strip() == n and n for n in rec.classnames)
        # the loose forms used to match folder names stay distinct
        assert len({paper._norm(n) for n in rec.classnames}) == len(rec.classnames), task
        assert len({paper._norm(n).replace(" ", "") for n in rec.classnames}) == len(rec.classnames), task
        entry = paper._prompts_doc()["datasets"][task]
        keys = [{k for n in (name, *more) for k in (paper._norm(n), paper._norm(n).replace(" ", ""))}
                for name, more in zip(entry["classnames"], entry.get("aliases") or [[]] * len(rec.classnames))]
        assert sum(map(len, keys)) == len(set().union(*keys)), f"{task}: a name or alias fits two classes"
        assert rec.templates and all(t.count("{}") == 1 and t.format("x") for t in rec.templates), task
        assert rec.templates == paper.templates_for(task)
        assert set(rec.source) == {"classnames", "templates"}
        for src in rec.source.values():
            _check_source(src)


def test_recorded_facts_and_sources():
    doc = paper._prompts_doc()
    for src in doc["sources"].values():
        _check_source(src)
    _check_source(doc["generic"]["source"])
    eurosat = paper.clip_prompts("EuroSAT")
    assert eurosat.templates == ("a centered satellite photo of {}.", "a centered satellite photo of a {}.",
                                 "a centered satellite photo of the {}.")
    assert eurosat.classnames[:3] == ("annual crop land", "forest", "brushland or shrubland")  # sorted-folder order
    assert eurosat.source["templates"]["repo"] == "mlfoundations/task_vectors"
    assert paper.templates_for("MNIST") == ('a photo of the number: "{}".',)
    assert paper.templates_for("KMNIST") == ("a photo of the character {}.",)
    assert paper.clip_prompts("KMNIST").classnames[:3] == ("o", "ki", "su")
    assert paper.clip_prompts("EMNIST").classnames == tuple("0123456789")
    assert paper.clip_prompts("GTSRB").classnames[0] == "red and white circle 20 kph speed limit"
    assert paper.clip_prompts("CIFAR100").classnames[1] == "aquarium_fish"  # torchvision's names, as the heads saw them
    assert paper.clip_prompts("OxfordIIITPet").classnames[:2] == ("Abyssinian", "American Bulldog")
    assert paper.clip_prompts("FER2013").classnames[-1] == "neutral"
    for task in ("Flowers102", "FER2013", "PCAM", "OxfordIIITPet", "RenderedSST2", "EMNIST", "FashionMNIST", "KMNIST"):
        assert paper.clip_prompts(task).source["templates"]["repo"] == "nik-dim/tall_masks"


def test_variants():
    for task in paper.paper_tasks(20):
        for variant in paper.PROMPT_VARIANTS:
            try:
                rec = paper.clip_prompts(task, variant)
            except ValueError:
                assert variant == "openai" and task in ("SVHN", "EMNIST", "FashionMNIST", "KMNIST")
                continue
            assert len(rec.classnames) == KNOWN_COUNTS[task]
            assert all(t.count("{}") == 1 for t in rec.templates)
            # every variant names the same classes: aligned to the default label order by name
            assert len(paper._aligned_names(task, variant)) == KNOWN_COUNTS[task]
    oa, lit = paper.clip_prompts("EuroSAT", "openai"), paper.clip_prompts("EuroSAT")
    assert oa.classnames != lit.classnames and sorted(oa.classnames) == sorted(lit.classnames)
    assert oa.source["classnames"]["repo"] == "openai/CLIP" and oa.templates == lit.templates
    assert paper._aligned_names("EuroSAT", "openai") == lit.classnames
    assert paper.clip_prompts("CIFAR100", "openai").classnames[1] == "aquarium fish"
    assert paper.templates_for("STL10", "task_singular_vectors") == paper.templates_for("CIFAR10")
    assert paper.clip_prompts("SUN397", "openai").classnames == paper.clip_prompts("SUN397").classnames
    with pytest.raises(ValueError, match="no prompts for this dataset"):
        paper.clip_prompts("SVHN", "openai")
    with pytest.raises(ValueError, match="unknown prompt variant"):
        paper.clip_prompts("SVHN", "mine")
    with pytest.raises(KeyError, match="recorded: SUN397"):
        paper.clip_prompts("ImageNet")
    assert paper.templates_for("task1") == ("a photo of a {}",)  # outside the file: CLIP's generic prompt


def test_folder_classes_named_by_the_standard_list(tmp_path):
    names = paper.clip_prompts("EuroSAT").classnames
    assert paper.prompt_names(tmp_path, EUROSAT_FOLDERS, "EuroSAT") == names
    assert paper.prompt_names(tmp_path, [f.lower() for f in EUROSAT_FOLDERS], "EuroSAT") == names
    # the user's folder order (here reversed) sets the label order; names follow their classes
    assert paper.prompt_names(tmp_path, EUROSAT_FOLDERS[::-1], "EuroSAT") == names[::-1]
    assert paper.prompt_names(tmp_path, EUROSAT_FOLDERS, "EuroSAT", variant="openai") == names
    # FER2013 as image folders (sorted: neutral before sad) and as integer labels 0..6
    fer = paper.prompt_names(tmp_path, ["angry", "disgust", "fear", "happy", "neutral", "sad", "surprise"], "FER2013")
    assert fer == ("angry", "disgusted", "fearful", "happy", "neutral", "sad", "surprised")
    assert paper.prompt_names(tmp_path, [str(i) for i in range(7)], "FER2013")[4:] == ("sad", "surprised", "neutral")
    # class indices: GTSRB's 00000..00042, Flowers102's 1..102 (sorted as strings by ImageFolder)
    gtsrb = paper.clip_prompts("GTSRB").classnames
    assert paper.prompt_names(tmp_path, [f"{i:05d}" for i in range(43)], "GTSRB") == gtsrb
    flowers = sorted(str(i) for i in range(1, 103))  # '1', '10', '100', ...
    got = paper.prompt_names(tmp_path, flowers, "Flowers102")
    assert got[:2] == (paper.clip_prompts("Flowers102").classnames[0], paper.clip_prompts("Flowers102").classnames[9])
    # SUN397 spellings: the literature's 'a_abbey' folders and the archive's 'a/abbey' paths
    sun = paper.clip_prompts("SUN397").classnames
    folders = [n[0] + "_" + n.replace(" ", "_") for n in sun]
    assert paper.prompt_names(tmp_path, folders, "SUN397") == sun
    assert paper.prompt_names(tmp_path, ["/".join([n[0], n.replace(" ", "_")]) for n in sun], "SUN397") == sun
    # CIFAR-100 / Food-101 / pets with spaces, underscores or another case
    pets = paper.clip_prompts("OxfordIIITPet").classnames
    assert paper.prompt_names(tmp_path, [p.lower().replace(" ", "_") for p in pets], "OxfordIIITPet") == pets


def test_mismatched_folders_name_the_dataset(tmp_path):
    with pytest.raises(ValueError, match=r"RESISC45: the dataset folder .* has 3 classes, the standard RESISC45 "
                                         r"class list has 45.*classnames.txt"):
        paper.prompt_names(tmp_path, ["a", "b", "c"], "RESISC45")
    wrong = list(EUROSAT_FOLDERS)
    wrong[3] = "Motorway"
    with pytest.raises(ValueError, match=r"EuroSAT: cannot match .*'Motorway'.*classnames.txt"):
        paper.prompt_names(tmp_path, wrong, "EuroSAT")
    with pytest.raises(ValueError, match="same standard class"):
        paper.prompt_names(tmp_path, ["Forest"] + EUROSAT_FOLDERS[1:], "EuroSAT")
    # classnames.txt wins: the user's names and order, any count
    (tmp_path / "classnames.txt").write_text("dense houses\nwoodland\nsea ice\n")
    assert paper.prompt_names(tmp_path, ["a", "b", "c"], "RESISC45") == ("dense houses", "woodland", "sea ice")


def test_load_paper_task_uses_and_checks_the_standard_names(tmp_path):
    from PIL import Image

    def write(root, classes):
        for split, n in (("train", 11), ("test", 2)):
            for c, name in enumerate(classes):
                (root / split / name).mkdir(parents=True)
                for i in range(n):
                    Image.fromarray(np.full((8, 8, 3), 20 * c + i, np.uint8)).save(root / split / name / f"{i}.png")

    write(tmp_path / "EuroSAT", EUROSAT_FOLDERS)
    data = paper.load_paper_task("EuroSAT", tmp_path / "EuroSAT", image_size=8, limit=2)
    assert data["test"].classes == paper.clip_prompts("EuroSAT").classnames
    write(tmp_path / "few", ["AnnualCrop", "Forest", "River"])
    with pytest.raises(ValueError, match="EuroSAT: the dataset folder .* has 3 classes"):
        paper.load_paper_task("EuroSAT", tmp_path / "few", image_size=8)


def test_prompts_file_is_package_data():
    assert importlib.resources.files("pactlib.data").joinpath(paper.PROMPTS_FILE).is_file()
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert paper.PROMPTS_FILE in pyproject["tool"]["setuptools"]["package-data"]["pactlib.data"]
