"""Helpers shared by the tests: throwaway servers, scripted graphs, fault tooling."""
