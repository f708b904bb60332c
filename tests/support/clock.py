"""A clock a test moves by hand (policies and caches take a `clock` callable)."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
