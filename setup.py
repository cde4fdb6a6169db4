"""Ships the top-level playbooks/ and values/ folders inside the wheel (as gpu_bootstrap/_data)."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA_FOLDERS = ("playbooks", "values")


class BuildWithData(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "gpu_bootstrap" / "_data"
        for folder in DATA_FOLDERS:
            if (ROOT / folder).is_dir():
                shutil.copytree(ROOT / folder, target / folder, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithData})
