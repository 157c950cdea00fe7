"""Only what pyproject.toml cannot say: diag-run.pth goes to the root of site-packages (see
diag/inject/site/hook.py), where Python runs it at start-up, before any sitecustomize."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("diag", "inject", "site", "diag-run.pth")


class BuildWithPth(build_py):
    def run(self) -> None:
        super().run()
        shutil.copy(PTH, os.path.join(self.build_lib, os.path.basename(PTH)))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, os.path.basename(PTH))]


setup(cmdclass={"build_py": BuildWithPth})
