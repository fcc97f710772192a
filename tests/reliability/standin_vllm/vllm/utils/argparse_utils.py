from argparse import ArgumentParser as FlexibleArgumentParser  # noqa: F401
