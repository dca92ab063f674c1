// A small C++20 program with constrained templates (a requires-clause, a concept, a
// standard concept, a constrained member template, an abbreviated template in a lambda),
// compiled with g++ -std=c++20: test_demangle demangles every one of its symbols.
#include <concepts>
#include <cstdio>

template <typename T>
concept Small = sizeof(T) <= 8;

template <typename T>
requires std::integral<T>
__attribute__((noinline)) T twice(T x)
{
    return x * 2;
}

template <Small T> __attribute__((noinline)) T thrice(T x)
{
    return x * 3;
}

template <std::floating_point T> __attribute__((noinline)) T half(T x)
{
    return x / 2;
}

struct Box {
    template <typename U>
    requires(sizeof(U) > 1) __attribute__((noinline)) int get(U u) const
    {
        return (int)u + 1;
    }
};

__attribute__((noinline)) auto make_lambda()
{
    return [](std::integral auto v) __attribute__((noinline))
    {
        return v + 1;
    };
}

int main(int argc, char **)
{
    Box b;
    std::printf("%d %d %f %d %d\n", twice(argc), thrice(argc), half(2.0 * argc), b.get(argc),
                make_lambda()(argc));
    return 0;
}
