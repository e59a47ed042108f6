"""A stand-in for dm-launchpad, which Acme 0.4.0 imports at start-up (acme.utils.signals)
but whose adders never use. dm-launchpad 0.5.0, Acme's pin, has no wheel for this
Python; run.py puts this directory on sys.path after the shim. Any use raises."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"launchpad.{name}: dm-launchpad is not installed (a stand-in "
                              "for Acme's import only)")
