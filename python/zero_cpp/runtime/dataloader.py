"""DeepSpeed's `RepeatingLoader`: a loader iterated without end, started
again when it runs out (a sampler's epoch, as under DeepSpeed, is the
caller's to set)."""


class RepeatingLoader:
    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
